"""The in-flight board: each gateway process publishes its requests in flight per worker in
a shared file mapping and reads the others' back, across real processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from homing.engines.pool.shared_in_flight import InFlightBoard, SharedCount, url_key


def test_a_url_has_one_slot_in_every_process_that_asks(tmp_path: Path) -> None:
    path = str(tmp_path / "b")
    leader = InFlightBoard.create(path, processes=2, slots=64)
    follower = InFlightBoard.open(path)
    first = leader.slot("grpc://10.0.0.1:30000")
    assert first is not None
    assert follower.slot("grpc://10.0.0.1:30000") == first
    assert follower.slot("grpc://10.0.0.2:30000") not in (None, first)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_each_process_reads_the_sum_of_the_others_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "b")
    board = InFlightBoard.create(path, processes=3, slots=8)
    slot = board.slot("grpc://w:1")
    assert slot is not None
    board.store(0, slot, 2)
    board.store(1, slot, 5)
    board.store(2, slot, 7)
    assert [board.others(p, slot) for p in range(3)] == [12, 9, 7]


def test_a_cleared_row_counts_nothing_for_the_others(tmp_path: Path) -> None:
    """A process that exited had its requests die with it: the supervisor clears its row."""
    board = InFlightBoard.create(str(tmp_path / "b"), processes=2, slots=8)
    slot = board.slot("grpc://w:1")
    assert slot is not None
    board.store(1, slot, 4)
    board.clear(1)
    assert board.others(0, slot) == 0


def test_colliding_keys_probe_to_the_next_free_slot_and_a_full_table_gives_none(
    tmp_path: Path,
) -> None:
    board = InFlightBoard.create(str(tmp_path / "b"), processes=1, slots=2)
    a, b = board.slot("grpc://a:1"), board.slot("grpc://b:1")
    assert {a, b} == {0, 1}
    assert board.slot("grpc://c:1") is None  # full: that worker's counts stay local
    assert board.slot("grpc://a:1") == a


def test_url_keys_are_never_zero_and_fit_63_bits() -> None:
    keys = [url_key(f"grpc://10.0.0.{i}:30000") for i in range(256)]
    assert all(0 < k < 2**63 for k in keys)
    assert len(set(keys)) == 256


def test_a_file_that_is_not_a_board_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="is not an in-flight board of this layout"):
        InFlightBoard.open(str(path))


CHILD = """
import sys
from homing.engines.pool.shared_in_flight import InFlightBoard, SharedCount
board = InFlightBoard.open(sys.argv[1])
count = SharedCount(board, 1, board.slot("grpc://w:1"))
count.publish(int(sys.argv[2]))
print(count.others(), flush=True)
"""


def test_another_process_sees_this_ones_count_and_publishes_its_own(tmp_path: Path) -> None:
    """A real second process opens the board, reads the 3 this one published, publishes
    11; this one reads 11 as the others' count."""
    path = str(tmp_path / "b")
    board = InFlightBoard.create(path, processes=2, slots=16)
    slot = board.slot("grpc://w:1")
    assert slot is not None
    mine = SharedCount(board, 0, slot)
    mine.publish(3)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, "11"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "3"
    assert mine.others() == 11
