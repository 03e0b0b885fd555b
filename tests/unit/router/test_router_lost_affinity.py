"""Lost affinity is load: after a worker's index part is flushed (restart, gap, cleared), the
router's expected prefill for requests to it rises by their now-uncached tokens, in the
decision, the dispatch ledger, the cost rule's queue, the engine's queue figure it reads and
the router's metrics."""

from __future__ import annotations

from smg_grpc_proto.generated import common_pb2

from homing.clock import ManualClock
from homing.engines.pool import EngineLoadView, WorkerState
from homing.obs.metrics import RouterMetrics
from homing.router import Router, RouteRequest, WorkerSnapshot, snapshot_from_state

PREFIX = list(range(5000, 5512))  # 512 tokens = 32 blocks held by the worker
PROMPT = [*PREFIX, *range(9000, 9040)]  # + 40 new tokens


def stored_batch(seq: int, tokens: list[int]) -> common_pb2.KvEventBatch:
    """A wire batch storing every full 16-token block of `tokens` as one chain."""
    batch = common_pb2.KvEventBatch(sequence_number=seq)
    ev = batch.events.add(event_id=seq)
    for i in range(len(tokens) // 16):
        ev.stored.blocks.add(block_hash=7_000 + i, token_ids=tokens[i * 16 : (i + 1) * 16])
    return batch


def warm_router(clock: ManualClock) -> Router:
    """A cache_aware router whose index credits w0 with PREFIX (from its KV events)."""
    router = Router("cache_aware", clock=clock)
    router.apply_kv_batch("w0", stored_batch(1, PREFIX))
    assert router.index.match(PROMPT) == {"w0": len(PREFIX)}
    return router


def test_dispatches_after_a_flush_are_charged_their_uncached_tokens() -> None:
    """Each decision enters its expected uncached tokens in the ledger, so the queue the
    cost rule sees on w0 grows by the full prompt once the hit is lost, against only the
    new tokens while it held."""
    clock = ManualClock(10.0)
    router = warm_router(clock)
    w0 = WorkerSnapshot("w0", load_at=9.0)  # the engine's record predates both dispatches
    hit = router.select(RouteRequest(PROMPT), [w0])
    assert (hit.matched_tokens, hit.uncached_tokens) == (512, 40)
    assert router.ledger.pending("w0", w0.load_at) == 40
    router.flush_worker("w0", "restart")
    clock.advance(0.1)
    miss = router.select(RouteRequest(PROMPT), [w0])
    assert (miss.matched_tokens, miss.uncached_tokens) == (0, len(PROMPT))
    assert router.ledger.pending("w0", w0.load_at) == 40 + len(PROMPT)
    # The flushed worker is in approximate mode now: the router's own dispatch credits it
    # with the prompt it was just sent, so the conversation's next turn is a hit again.
    assert router.index.match(PROMPT).get("w0") == len(PROMPT) // 16 * 16


def test_the_engines_queue_figure_counts_uncached_tokens() -> None:
    """The snapshot's queue is the record's `waiting_uncached_tokens` (the waiting
    requests' tokens not in the engine's prefix cache, so a cold engine's queue shows its
    misses), not `prefill_pending_tokens` (every prompt token, cached or not), which is
    only the fallback."""

    def state(uncached: int | None, pending: int | None) -> WorkerState:
        load = EngineLoadView(
            running=2,
            waiting=3,
            waiting_uncached_tokens=uncached,
            token_usage=0.4,
            max_running_requests=64,
            updated_at=5.0,
            prefill_pending_tokens=pending,
        )
        return WorkerState(worker_id="w0", url="grpc://127.0.0.1:1", load=load)

    warm, cold = state(120, 3000), state(2900, 3000)  # same prompts, hit vs miss
    assert snapshot_from_state(warm).queued_prefill_tokens == 120
    assert snapshot_from_state(cold).queued_prefill_tokens == 2900
    assert snapshot_from_state(state(None, 3000)).queued_prefill_tokens == 3000
    assert snapshot_from_state(state(None, None)).queued_prefill_tokens is None
    snap = snapshot_from_state(warm)
    assert (snap.max_running_requests, snap.token_usage, snap.load_at) == (64, 0.4, 5.0)


def test_router_metrics_show_the_dip_in_expected_hits() -> None:
    """`homing_router_cached_tokens_total` / `homing_router_prefill_tokens_total` per worker
    count each decision's matched and expected-uncached tokens: the hit share drops after
    the flush and recovers with the next turn; a removed worker's series go."""
    clock = ManualClock(10.0)
    router = warm_router(clock)
    metrics = RouterMetrics(router, model="m").attach()
    w0 = WorkerSnapshot("w0")

    def counts() -> tuple[float, float]:
        return (
            metrics.value("homing_router_cached_tokens_total", worker="w0"),
            metrics.value("homing_router_prefill_tokens_total", worker="w0"),
        )

    router.select(RouteRequest(PROMPT), [w0])
    assert counts() == (512, 40)
    router.flush_worker("w0", "restart")
    router.select(RouteRequest(PROMPT), [w0])  # cold now
    assert counts() == (512, 40 + len(PROMPT))
    router.select(RouteRequest([*PROMPT, *range(9100, 9116)]), [w0])  # next turn: a hit again
    assert counts() == (512 + 544, 40 + len(PROMPT) + 24)
    router.remove_worker("w0")
    text = metrics.registry.get_sample_value(
        "homing_router_prefill_tokens_total", {"model": "m", "worker": "w0"}
    )
    assert text is None
