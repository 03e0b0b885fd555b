"""Engine requests of one request's choices: no id is a prefix of another, since SGLang's
Abort takes out every request whose id starts with the given id; each seeded choice has its
own seed."""

from __future__ import annotations

import pytest

from homing.gateway.generation import choice_seed, engine_request_id


@pytest.mark.parametrize("n", [1, 2, 10, 11, 12, 100, 101, 128])
def test_no_choice_id_is_a_prefix_of_another(n: int) -> None:
    ids = [engine_request_id("a1b2", index, n) for index in range(n)]
    assert len(set(ids)) == n
    assert not [(a, b) for a in ids for b in ids if a != b and b.startswith(a)]


def test_ids_are_the_base_and_a_padded_index() -> None:
    assert [engine_request_id("r", i, 12) for i in (0, 1, 11)] == ["r-00", "r-01", "r-11"]
    assert engine_request_id("r", 0, 1) == "r-0"


def test_choice_seeds_are_seed_plus_index_within_64_bits() -> None:
    assert choice_seed(None, 1) is None
    assert [choice_seed(5, i) for i in range(3)] == [5, 6, 7]
    assert choice_seed(2**63 - 1, 1) == -(2**63)
