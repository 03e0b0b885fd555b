"""The KV-stream cursor applies in-order batches, skips duplicates and flushes on gaps."""

from __future__ import annotations

from smg_grpc_proto.generated import common_pb2

from homing.engines.kv_stream import KvStreamCursor


def batch(seq: int, *, load_only: bool = False, rank: int | None = None) -> common_pb2.KvEventBatch:
    """A batch with a load record (load_only as given)."""
    b = common_pb2.KvEventBatch(sequence_number=seq)
    b.load.running_requests = 3
    b.load.load_only = load_only
    if rank is not None:
        b.dp_rank = rank
    return b


def test_load_only_batches_update_load_and_nothing_else() -> None:
    """Heartbeats numbered 0 before the first batch carry a load and no cursor move."""
    cursor = KvStreamCursor()
    step = cursor.feed(batch(0, load_only=True))
    assert step.load is not None and step.load.running_requests == 3
    assert not step.apply and not step.flush
    assert cursor.last_sequence() is None


def test_first_then_consecutive_batches_apply() -> None:
    """The first event batch sets the cursor; the next number applies without a flush."""
    cursor = KvStreamCursor()
    assert cursor.feed(batch(41)).apply
    step = cursor.feed(batch(42))
    assert step.apply and not step.flush and step.gap == 0


def test_duplicate_is_skipped() -> None:
    """A batch at or below the cursor is not applied twice."""
    cursor = KvStreamCursor()
    cursor.feed(batch(5))
    cursor.feed(batch(6))
    assert not cursor.feed(batch(6)).apply
    assert cursor.last_sequence() == 6


def test_gap_flushes_then_applies() -> None:
    """Skipping two numbers asks for a flush before applying, with the gap size."""
    cursor = KvStreamCursor()
    cursor.feed(batch(1))
    step = cursor.feed(batch(4))
    assert step.flush and step.apply and step.gap == 2
    assert cursor.last_sequence() == 4


def test_ranks_are_counted_separately() -> None:
    """Sequence numbers are per dp_rank: interleaved ranks are not gaps."""
    cursor = KvStreamCursor()
    cursor.feed(batch(1, rank=0))
    cursor.feed(batch(7, rank=1))
    assert not cursor.feed(batch(2, rank=0)).flush
    assert not cursor.feed(batch(8, rank=1)).flush
