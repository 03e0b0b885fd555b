"""The Router facade builds policies by name and feeds the index from wire batches."""

from __future__ import annotations

import pytest
from smg_grpc_proto.generated import common_pb2

from homing.clock import ManualClock
from homing.router import Router, RouteRequest, WorkerSnapshot
from homing.router.policies import PolicyContext, RoundRobinPolicy

TOKENS = list(range(100, 132))  # two blocks of 16


def stored_batch(seq: int, tokens: list[int], base_hash: int) -> common_pb2.KvEventBatch:
    """A wire batch storing every full 16-token block of `tokens` as one chain."""
    batch = common_pb2.KvEventBatch(sequence_number=seq)
    ev = batch.events.add(event_id=seq)
    for i in range(len(tokens) // 16):
        ev.stored.blocks.add(block_hash=base_hash + i, token_ids=tokens[i * 16 : (i + 1) * 16])
    return batch


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
    assert (decision.worker_id, decision.branch, decision.matched_tokens) == ("w1", "cache_hit", 32)
    assert router.last_event_at("w1") == 5.0
    assert router.decisions["cache_hit"] == 1


def test_flush_worker_forgets_its_prefixes() -> None:
    """flush_worker removes a worker's credit; the next decision is by load."""
    router = Router()
    router.apply_kv_batch("w1", stored_batch(1, TOKENS, 10))
    router.flush_worker("w1")
    decision = router.select(RouteRequest(TOKENS), [WorkerSnapshot("w0"), WorkerSnapshot("w1")])
    assert decision.branch == "load"
    assert decision.matched_tokens == 0


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
