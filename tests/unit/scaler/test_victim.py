"""Scale-down removes the replicas whose removal costs least: outliers and cordoned ones first,
then fewest streams in flight, then least cache value, then worker id."""

from __future__ import annotations

import itertools

import pytest

from homing.router.index import PrefixIndex
from homing.scaler.victim import (
    RECENT_WEIGHT,
    VictimCandidate,
    cache_cost,
    choose_victims,
)
from tests.unit.router.test_router_index import BS, prompt, stored_chain


def cand(
    worker_id: str,
    in_flight: int = 0,
    unique: int = 0,
    recent: int = 0,
    phase: str = "ready",
) -> VictimCandidate:
    """A candidate with the given streams and cache."""
    return VictimCandidate(worker_id, in_flight, unique, recent, phase)


def ids(victims: list[VictimCandidate]) -> list[str]:
    """The victims' worker ids in order."""
    return [v.worker_id for v in victims]


class TestOrder:
    def test_fewer_streams_go_first_whatever_the_cache(self) -> None:
        """A worker with one stream in flight outranks one with a huge cache but more."""
        pool = [cand("a", in_flight=3), cand("b", in_flight=1, unique=10_000, recent=10_000)]
        assert ids(choose_victims(pool, 1)) == ["b"]
        assert ids(choose_victims(pool, 2)) == ["b", "a"]

    def test_equal_streams_then_least_cache(self) -> None:
        """Among workers with the same streams the one losing fewest blocks goes first."""
        pool = [cand("a", 2, unique=50), cand("b", 2, unique=5), cand("c", 2, unique=20)]
        assert ids(choose_victims(pool, 3)) == ["b", "c", "a"]

    def test_recent_blocks_weigh_recent_weight(self) -> None:
        """One recent block costs RECENT_WEIGHT idle ones: just below that, it is dearer."""
        assert cache_cost(cand("a", unique=10, recent=2)) == 10 + (RECENT_WEIGHT - 1) * 2
        hot = cand("hot", unique=1, recent=1)  # cost RECENT_WEIGHT
        cold_cheaper = cand("cold", unique=int(RECENT_WEIGHT) - 1)
        cold_dearer = cand("cold", unique=int(RECENT_WEIGHT) + 1)
        assert ids(choose_victims([hot, cold_cheaper], 1)) == ["cold"]
        assert ids(choose_victims([hot, cold_dearer], 1)) == ["hot"]

    def test_ejected_first_then_cordoned_whatever_streams_and_cache(self) -> None:
        """The outlier goes first even when busier and hotter; a cordoned worker next."""
        pool = [
            cand("idle"),
            cand("cordoned", in_flight=5, unique=100, phase="cordoned"),
            cand("ejected", in_flight=9, unique=900, recent=900, phase="ejected"),
        ]
        assert ids(choose_victims(pool, 3)) == ["ejected", "cordoned", "idle"]

    def test_ties_break_by_worker_id_whatever_the_input_order(self) -> None:
        """Equal costs give the same answer for every permutation of the input."""
        pool = [cand("w2", 1, 3), cand("w0", 1, 3), cand("w1", 1, 3)]
        answers = {tuple(ids(choose_victims(p, 2))) for p in itertools.permutations(pool)}
        assert answers == {("w0", "w1")}


class TestCount:
    def test_count_larger_than_candidates_gives_all(self) -> None:
        """Asking for more victims than workers returns every eligible one, cheapest first."""
        pool = [cand("a", 1), cand("b", 0)]
        assert ids(choose_victims(pool, 5)) == ["b", "a"]

    def test_count_zero_gives_none(self) -> None:
        """No removal asked, none chosen."""
        assert choose_victims([cand("a")], 0) == []

    def test_draining_and_gone_workers_are_never_chosen(self) -> None:
        """A worker already leaving is skipped: removing it again frees nothing."""
        pool = [cand("d", phase="draining"), cand("g", phase="gone"), cand("r", 4, 40)]
        assert ids(choose_victims(pool, 3)) == ["r"]


class TestErrors:
    def test_negative_count_is_refused(self) -> None:
        """A negative count is a caller's bug, not an empty answer."""
        with pytest.raises(ValueError, match="count"):
            choose_victims([cand("a")], -1)

    def test_duplicate_ids_are_refused(self) -> None:
        """One worker twice would be removed twice."""
        with pytest.raises(ValueError, match="twice"):
            choose_victims([cand("a"), cand("a", 1)], 1)

    @pytest.mark.parametrize(
        ("in_flight", "unique", "recent", "phase"),
        [(-1, 0, 0, "ready"), (0, 1, 2, "ready"), (0, -1, 0, "ready"), (0, 0, 0, "asleep")],
    )
    def test_out_of_range_candidates_are_refused(
        self, in_flight: int, unique: int, recent: int, phase: str
    ) -> None:
        """Negative streams or blocks, more recent than unique blocks, an unknown phase."""
        with pytest.raises(ValueError):
            VictimCandidate("a", in_flight, unique, recent, phase)


def test_candidates_from_the_index_pick_the_worker_losing_least() -> None:
    """Filled from `PrefixIndex.cache_value`, the worker holding only what others hold too is
    chosen over the one whose own continuation would be lost."""
    system = prompt(8)
    index = PrefixIndex(BS)
    index.apply("w0", stored_chain(system + prompt(12, offset=100), 10))
    index.apply("w1", stored_chain(system, 10))
    pool = []
    for wid in ("w0", "w1"):
        value = index.cache_value(wid)
        pool.append(VictimCandidate(wid, 0, value.unique_blocks, value.unique_recent_blocks))
    assert ids(choose_victims(pool, 1)) == ["w1"]
