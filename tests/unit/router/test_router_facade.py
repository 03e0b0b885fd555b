"""The Router facade builds policies by name and feeds the index from wire batches."""

from __future__ import annotations

import pytest
from smg_grpc_proto.generated import common_pb2

from homing.clock import ManualClock
from homing.config import CostWeightSettings, RouterModelSettings, RouterSettings
from homing.obs.metrics import RouterMetrics
from homing.router import Router, RouteRequest, WorkerSnapshot
from homing.router.policies import PolicyContext, RoundRobinPolicy
from homing.router.settings import apply_model_settings, router_from_settings

TOKENS = list(range(100, 132))  # two blocks of 16


def stored_batch(seq: int, tokens: list[int], base_hash: int) -> common_pb2.KvEventBatch:
    """A wire batch storing every full 16-token block of `tokens` as one chain."""
    batch = common_pb2.KvEventBatch(sequence_number=seq)
    ev = batch.events.add(event_id=seq)
    for i in range(len(tokens) // 16):
        ev.stored.blocks.add(block_hash=base_hash + i, token_ids=tokens[i * 16 : (i + 1) * 16])
    return batch


def test_known_policies_are_the_four_of_issue_4() -> None:
    """round_robin, least_load, consistent_hash and cache_aware share one interface."""
    for name in ("round_robin", "least_load", "consistent_hash", "cache_aware"):
        assert Router(name).policy_name == name


def test_default_policy_is_cache_aware() -> None:
    """A Router built with no arguments routes with cache_aware."""
    assert Router().policy_name == "cache_aware"


def test_unknown_policy_is_rejected() -> None:
    """An unknown policy name is a ValueError naming the known ones."""
    with pytest.raises(ValueError, match="round_robin"):
        Router("fastest")


def test_registry_is_explicit() -> None:
    """A caller-supplied registry replaces the built-ins."""
    router = Router("rr", registry={"rr": lambda ctx: RoundRobinPolicy()})
    assert router.policy_name == "round_robin"


def test_kv_batch_makes_the_router_prefer_the_holder() -> None:
    """After a worker's stored batch, cache_aware sends that prompt to it."""
    clock = ManualClock(5.0)
    router = Router(clock=clock)
    router.apply_kv_batch("w1", stored_batch(1, TOKENS, 10))
    workers = [WorkerSnapshot("w0"), WorkerSnapshot("w1")]
    decision = router.select(RouteRequest([*TOKENS, 1, 2, 3]), workers)
    assert (decision.worker_id, decision.branch, decision.matched_tokens) == ("w1", "exact_hit", 32)
    assert router.last_event_at("w1") == 5.0
    assert router.decisions["exact_hit"] == 1
    assert router.worker_mode("w1") == "exact"


def test_flush_worker_forgets_its_prefixes() -> None:
    """flush_worker removes a worker's credit; the next decision is a cold one (ring)."""
    router = Router()
    router.apply_kv_batch("w1", stored_batch(1, TOKENS, 10))
    router.flush_worker("w1", "restart")
    decision = router.select(RouteRequest(TOKENS), [WorkerSnapshot("w0"), WorkerSnapshot("w1")])
    assert decision.branch == "ring"
    assert decision.matched_tokens == 0
    assert router.worker_mode("w1") == "approximate"


def test_policy_context_carries_index_and_clock() -> None:
    """Factories receive the router's own index and clock."""
    seen: list[PolicyContext] = []

    def factory(ctx: PolicyContext) -> RoundRobinPolicy:
        seen.append(ctx)
        return RoundRobinPolicy()

    clock = ManualClock()
    router = Router("x", registry={"x": factory}, clock=clock, block_size=32)
    assert seen[0].index is router.index and seen[0].clock is clock
    assert router.block_size == 32


def test_silent_worker_is_credited_approximately_with_what_it_was_sent() -> None:
    """A worker that never published gets its dispatched prompt as approximate credit."""
    clock = ManualClock(100.0)
    router = Router(clock=clock, approx_ttl_s=60.0)
    first = router.select(RouteRequest(TOKENS), [WorkerSnapshot("w0"), WorkerSnapshot("w1")])
    clock.advance(1.0)  # a load record taken after the dispatch has absorbed it
    workers = [WorkerSnapshot("w0", load_at=100.5), WorkerSnapshot("w1", load_at=100.5)]
    again = router.select(RouteRequest([*TOKENS, 7, 8]), workers)
    assert (again.worker_id, again.branch) == (first.worker_id, "approx_hit")
    clock.advance(80.0)
    later = router.select(RouteRequest([*TOKENS, 9]), workers)
    assert later.branch == "ring"


def test_each_decision_is_entered_in_the_ledger() -> None:
    """The uncached tokens of every dispatch are pending on its worker until a record."""
    clock = ManualClock(1.0)
    router = Router("round_robin", clock=clock)
    decision = router.select(RouteRequest(TOKENS), [WorkerSnapshot("w0")])
    assert decision.uncached_tokens == len(TOKENS)
    assert router.ledger.pending("w0", 0.5) == len(TOKENS)
    assert router.ledger.pending("w0", 1.5) == 0


def test_set_policy_keeps_the_index() -> None:
    """Switching policy (per-model settings) keeps what the index mirrors."""
    router = Router("round_robin")
    router.apply_kv_batch("w1", stored_batch(1, TOKENS, 10))
    router.set_policy("cache_aware")
    decision = router.select(RouteRequest(TOKENS), [WorkerSnapshot("w0"), WorkerSnapshot("w1")])
    assert (decision.worker_id, decision.branch) == ("w1", "exact_hit")


def test_removed_worker_leaves_index_ring_and_ledger() -> None:
    """remove_worker forgets the worker everywhere the router keeps state."""
    router = Router("consistent_hash")
    router.apply_kv_batch("w1", stored_batch(1, TOKENS, 10))
    router.select(RouteRequest(TOKENS), [WorkerSnapshot("w0"), WorkerSnapshot("w1")])
    router.remove_worker("w1")
    assert router.index.match(TOKENS) == {}
    assert "w1" not in router.policy.ring  # type: ignore[attr-defined]
    assert "w1" not in router.ledger.oldest
    assert router.ledger.pending("w1", None) == 0


def test_metrics_observe_decisions_batches_and_flushes() -> None:
    """RouterMetrics counts decisions by branch, event batches, gaps and resyncs."""
    router = Router()
    metrics = RouterMetrics(router, model="m").attach()
    router.apply_kv_batch("w1", stored_batch(1, TOKENS, 10), lag_s=0.002)
    router.select(RouteRequest(TOKENS), [WorkerSnapshot("w0"), WorkerSnapshot("w1")])
    router.flush_worker("w1", "gap")
    assert (
        metrics.value("homing_router_decisions_total", policy="cache_aware", branch="exact_hit")
        == 1
    )
    assert metrics.value("homing_router_kv_event_batches_total", worker="w1") == 1
    assert metrics.value("homing_router_kv_events_total", worker="w1", kind="stored") == 2
    assert metrics.value("homing_router_kv_gaps_total", worker="w1") == 1
    assert metrics.value("homing_router_kv_resyncs_total", worker="w1", reason="exact_mode") == 1
    assert metrics.value("homing_router_kv_event_lag_seconds_count") == 1
    assert metrics.value("homing_router_worker_mode", worker="w1", mode="approximate") == 1
    assert metrics.value("homing_router_index_blocks", worker="w1") == 0
    router.apply_kv_batch("w1", stored_batch(2, TOKENS, 10))
    assert metrics.value("homing_router_kv_event_batches_total", worker="w1") == 2
    cold = RouteRequest(list(range(90_000, 90_064)))
    pair = [WorkerSnapshot("w0"), WorkerSnapshot("w1")]
    assert router.select(cold, pair).branch == "ring"
    router.set_policy("consistent_hash")  # the same branch name under another policy
    assert router.select(cold, pair).branch == "ring"
    for policy in ("cache_aware", "consistent_hash"):
        assert metrics.value("homing_router_decisions_total", policy=policy, branch="ring") == 1


def test_settings_build_the_router_and_override_per_model() -> None:
    """RouterSettings give the router-wide policy; `models` switches one model's policy."""
    settings = RouterSettings(
        policy="least_load",
        weights=CostWeightSettings(decode=64.0),
        models={"big": RouterModelSettings(policy="cache_aware")},
    )
    router = router_from_settings(settings)
    assert router.policy_name == "least_load"
    assert not apply_model_settings(router, settings, "small")
    assert apply_model_settings(router, settings, "big")
    assert router.policy_name == "cache_aware"
    assert router.policy.config.weights.decode == 64.0  # type: ignore[attr-defined]


def test_config_defaults_are_the_policy_defaults() -> None:
    """RouterSettings() builds exactly the documented CacheAwareConfig defaults."""
    from homing.router import CacheAwareConfig
    from homing.router.settings import policy_configs

    _, cache_aware, _ = policy_configs(RouterSettings())
    assert cache_aware == CacheAwareConfig()


def test_serve_accepts_every_policy_name() -> None:
    """`homing serve --policy NAME` offers the four built-in policies."""
    from homing.cli import build_parser

    for name in ("round_robin", "least_load", "consistent_hash", "cache_aware"):
        assert build_parser().parse_args(["serve", "--policy", name]).policy == name
