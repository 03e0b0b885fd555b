"""Routing policies: round robin cycles, least load picks the minimum, cache_aware trades
prefix affinity against load and never lets affinity override an overloaded worker."""

from __future__ import annotations

import pytest

from homing.router import (
    CacheAwareConfig,
    CacheAwarePolicy,
    LeastLoadPolicy,
    NoWorkerAvailable,
    PrefixIndex,
    RoundRobinPolicy,
    RouteRequest,
    WorkerSnapshot,
)
from homing.router.events import BlocksStored, StoredBlock
from homing.router.filters import OverloadThresholds, overloaded
from homing.router.scorers import load_score, prefix_score

BS = 16


def snap(worker_id: str, **kw: float) -> WorkerSnapshot:
    """A snapshot with the given load fields (zeros otherwise)."""
    return WorkerSnapshot(worker_id=worker_id, **kw)  # type: ignore[arg-type]


def store(index: PrefixIndex, worker_id: str, tokens: list[int]) -> None:
    """Credit `worker_id` with every full block of `tokens`."""
    n = len(tokens) // BS
    blocks = tuple(
        StoredBlock(
            engine_hash=hash((worker_id, i)), token_ids=tuple(tokens[i * BS : (i + 1) * BS])
        )
        for i in range(n)
    )
    index.apply(worker_id, BlocksStored(blocks=blocks))


PROMPT = list(range(1000, 1256))  # 256 tokens = 16 blocks
REQUEST = RouteRequest(prompt_ids=PROMPT)


class TestRoundRobin:
    def test_cycles_over_workers_in_id_order(self) -> None:
        """Successive decisions visit w0, w1, w2, w0, ... whatever the input order."""
        policy = RoundRobinPolicy()
        workers = [snap("w2"), snap("w0"), snap("w1")]
        picks = [policy.select(REQUEST, workers).worker_id for _ in range(6)]
        assert picks == ["w0", "w1", "w2", "w0", "w1", "w2"]

    def test_ignores_load(self) -> None:
        """Round robin still visits a busy worker in its turn."""
        policy = RoundRobinPolicy()
        workers = [snap("w0", in_flight=100), snap("w1")]
        assert {policy.select(REQUEST, workers).worker_id for _ in range(2)} == {"w0", "w1"}

    def test_empty_candidates_raise(self) -> None:
        """No candidates is an explicit error."""
        with pytest.raises(NoWorkerAvailable):
            RoundRobinPolicy().select(REQUEST, [])


class TestLeastLoad:
    def test_picks_min_load(self) -> None:
        """The worker with the fewest requests wins."""
        policy = LeastLoadPolicy()
        workers = [
            snap("w0", in_flight=3),
            snap("w1", running=1, waiting=1),
            snap("w2", in_flight=5),
        ]
        decision = policy.select(REQUEST, workers)
        assert decision.worker_id == "w1" and decision.branch == "load"

    def test_load_is_max_of_own_and_engine_counts(self) -> None:
        """Load counts max(in_flight, running + waiting), not their sum."""
        assert snap("w0", in_flight=2, running=2, waiting=1).load == 3
        assert snap("w0", in_flight=4, running=1).load == 4

    def test_token_usage_breaks_load_ties(self) -> None:
        """At equal load the worker with more KV headroom wins."""
        policy = LeastLoadPolicy()
        workers = [snap("w0", token_usage=0.5), snap("w1", token_usage=0.1)]
        assert policy.select(REQUEST, workers).worker_id == "w1"

    def test_full_ties_rotate(self) -> None:
        """Idle identical workers share sequential requests instead of w0 taking all."""
        policy = LeastLoadPolicy()
        workers = [snap("w0"), snap("w1")]
        picks = [policy.select(REQUEST, workers).worker_id for _ in range(4)]
        assert picks == ["w0", "w1", "w0", "w1"]

    def test_empty_candidates_raise(self) -> None:
        """No candidates is an explicit error."""
        with pytest.raises(NoWorkerAvailable):
            LeastLoadPolicy().select(REQUEST, [])


class TestCacheAware:
    def test_prefers_the_holder_of_the_prefix(self) -> None:
        """With equal load, the worker holding the prompt's prefix wins as a cache hit."""
        index = PrefixIndex(BS)
        store(index, "w1", PROMPT)
        policy = CacheAwarePolicy(index)
        decision = policy.select(REQUEST, [snap("w0"), snap("w1"), snap("w2")])
        assert decision.worker_id == "w1"
        assert decision.branch == "cache_hit"
        assert decision.matched_tokens == 256

    def test_longer_prefix_wins(self) -> None:
        """Of two holders, the one with the longer prefix wins at equal load."""
        index = PrefixIndex(BS)
        store(index, "w0", PROMPT[:64])
        store(index, "w1", PROMPT[:192])
        decision = CacheAwarePolicy(index).select(REQUEST, [snap("w0"), snap("w1")])
        assert (decision.worker_id, decision.matched_tokens) == ("w1", 192)

    def test_holder_wins_over_slightly_less_loaded_worker(self) -> None:
        """A full hit outweighs one extra request on the holder."""
        index = PrefixIndex(BS)
        store(index, "w1", PROMPT)
        decision = CacheAwarePolicy(index).select(REQUEST, [snap("w0"), snap("w1", in_flight=1)])
        assert decision.worker_id == "w1"

    def test_small_hit_loses_to_much_less_loaded_worker(self) -> None:
        """A 12.5% hit is not worth 4 more requests (score formula in the docstring)."""
        index = PrefixIndex(BS)
        store(index, "w1", PROMPT[:32])
        decision = CacheAwarePolicy(index).select(
            REQUEST, [snap("w0", in_flight=1), snap("w1", in_flight=5)]
        )
        assert decision.worker_id == "w0"

    def test_overload_veto_by_queue_imbalance(self) -> None:
        """A holder with a queue far above the least loaded worker is vetoed."""
        index = PrefixIndex(BS)
        store(index, "w1", PROMPT)
        decision = CacheAwarePolicy(index).select(
            REQUEST, [snap("w0", in_flight=1), snap("w1", running=8, waiting=12)]
        )
        assert decision.worker_id == "w0"
        assert decision.branch == "veto"

    def test_overload_veto_by_kv_usage(self) -> None:
        """A holder whose KV cache is 96% used is vetoed even when otherwise idle."""
        index = PrefixIndex(BS)
        store(index, "w1", PROMPT)
        decision = CacheAwarePolicy(index).select(
            REQUEST, [snap("w0", in_flight=2), snap("w1", token_usage=0.96)]
        )
        assert decision.worker_id == "w0"
        assert decision.branch == "veto"

    def test_everyone_overloaded_falls_back_to_least_load(self) -> None:
        """When every worker is over the KV threshold, the least loaded one still serves."""
        index = PrefixIndex(BS)
        store(index, "w0", PROMPT)
        decision = CacheAwarePolicy(index).select(
            REQUEST,
            [snap("w0", token_usage=0.99, in_flight=9), snap("w1", token_usage=0.97, in_flight=3)],
        )
        assert decision.worker_id == "w1"
        assert decision.branch == "overload"

    def test_no_match_falls_back_to_least_load(self) -> None:
        """With nothing cached anywhere, the least loaded worker wins with branch "load"."""
        index = PrefixIndex(BS)
        decision = CacheAwarePolicy(index).select(
            REQUEST, [snap("w0", in_flight=2), snap("w1", in_flight=1)]
        )
        assert (decision.worker_id, decision.branch, decision.matched_tokens) == ("w1", "load", 0)

    def test_tiny_match_is_not_useful(self) -> None:
        """One block of a long prompt (below min_match_ratio) does not count as affinity."""
        index = PrefixIndex(BS)
        long_prompt = list(range(2000))
        store(index, "w0", long_prompt[:16])
        decision = CacheAwarePolicy(index).select(
            RouteRequest(long_prompt), [snap("w0", in_flight=1), snap("w1")]
        )
        assert (decision.worker_id, decision.branch) == ("w1", "load")

    def test_weights_are_configurable(self) -> None:
        """With the load weight at zero, a holder wins however loaded (veto aside)."""
        index = PrefixIndex(BS)
        store(index, "w1", PROMPT[:32])
        config = CacheAwareConfig(load_weight=0.0)
        decision = CacheAwarePolicy(index, config).select(
            REQUEST, [snap("w0", in_flight=1), snap("w1", in_flight=5)]
        )
        assert decision.worker_id == "w1"

    def test_empty_candidates_raise(self) -> None:
        """No candidates is an explicit error."""
        with pytest.raises(NoWorkerAvailable):
            CacheAwarePolicy(PrefixIndex(BS)).select(REQUEST, [])


class TestUnits:
    def test_overloaded_never_vetoes_the_least_loaded_by_imbalance(self) -> None:
        """The imbalance rule is relative to the least loaded worker, which always passes."""
        workers = [snap("w0", in_flight=50), snap("w1", in_flight=100)]
        assert overloaded(workers, OverloadThresholds()) == {"w1"}

    def test_scores_are_in_unit_range(self) -> None:
        """Scorers clamp to [0, 1]."""
        assert prefix_score(300, 256) == 1.0
        assert prefix_score(0, 0) == 0.0
        assert load_score(10, 4, 8) == 0.0
        assert load_score(0, 0, 8) == 1.0
