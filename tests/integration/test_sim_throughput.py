"""The sim throughput tool end to end on a small slice of the Mooncake trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.bench.sim_throughput import _route, run_trial
from homing.bench.traces import TraceRequest, load_trace

TRACE = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "traces"
    / "mooncake"
    / "conversation_trace.jsonl"
)


async def test_a_short_trial_replays_requests_and_reads_the_sims_clock_figures() -> None:
    """Two workers at 40x for 3 s: requests are sent and completed without errors, KV events
    arrive, and the keep-up figures come from the sim's /metrics."""
    if not TRACE.exists():
        pytest.skip(f"trace not found at {TRACE}")
    requests = load_trace(TRACE, limit=40)
    result = await run_trial(
        requests,
        speedup=40.0,
        workers=2,
        model="llama-3.1-8b",
        duration_s=3.0,
        warmup_s=0.5,
        max_slip_share=1.0,
    )
    assert result.workers == 2
    assert result.requests_sent > 10
    assert result.requests_completed > 0
    assert result.request_errors == 0
    assert result.kv_event_batches > 0
    assert result.modeled_wall_s > 0
    assert 0.0 <= result.slip_share <= 1.0


def test_affinity_routing_keeps_a_conversation_on_one_worker() -> None:
    """Requests sharing their second Mooncake block go to the same worker; round-robin
    spreads them."""
    turn1 = TraceRequest(0, 0.0, 1024, 10, (0, 77))
    turn2 = TraceRequest(1, 1.0, 2048, 10, (0, 77, 78, 79))
    assert _route(turn1, 0, 8, "affinity") == _route(turn2, 1, 8, "affinity")
    assert _route(turn1, 0, 8, "round_robin") != _route(turn2, 1, 8, "round_robin")
