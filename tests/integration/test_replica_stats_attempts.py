"""Per-replica stats (what outlier ejection reads) credit each attempt of a retried request
to its own worker: the worker that failed gets the error, and the worker that served it is
timed from its own attempt's start, not from the request's. Over real simulated workers,
the failure injected through the fault sidecar."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from helpers import eventually, own_app, post_fault
from structlog.testing import capture_logs

from homing.config import (
    BreakerSettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    OutlierSettings,
    RouterSettings,
    SimSettings,
)

pytestmark = pytest.mark.asyncio

MODEL = "llama-3.1-8b"
SESSION = "pin-me"
#: How long the request sits on the stalled worker before that worker fails it (s).
HELD_S = 0.6


def _config() -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            health_interval_s=0.2,
            unhealthy_threshold=10_000,  # the stalled worker's probes do not take it out
            breaker=BreakerSettings(enabled=False),
            outliers=OutlierSettings(enabled=False),
        ),
        router=RouterSettings(policy="consistent_hash"),
        sim=SimSettings(workers=2, speedup=10.0),
    )


async def test_a_retry_is_an_error_of_the_failed_worker_and_times_only_the_server() -> None:
    """A stream pinned to a stalled worker waits there `HELD_S`, then that worker restarts
    (aborting it) and the request is retried on the other. The client's TTFT counts the wait;
    the stalled worker's stats hold one error besides the probe request, and the serving
    worker's one request is timed from its own attempt: its TTFT is below `HELD_S`."""
    async with own_app(_config()) as app:
        assert app.pool is not None
        url = f"http://127.0.0.1:{app.http_port}/v1/completions"
        headers = {"x-session-id": SESSION}
        async with aiohttp.ClientSession() as http:
            probe = {"model": MODEL, "prompt": "probe", "max_tokens": 1}
            async with http.post(url, json=probe, headers=headers) as resp:
                assert resp.status == 200
                pinned_id = resp.headers["x-homing-worker"]
            first, second = app.pool.workers()
            pinned, other = (first, second) if first.worker_id == pinned_id else (second, first)
            await post_fault(pinned.url, {"stall_s": 30})
            body = {
                "model": MODEL,
                "prompt": "Tell me about routing requests to replicas.",
                "max_tokens": 8,
                "stream": True,
            }
            with capture_logs() as logs:
                started = time.monotonic()
                call = asyncio.ensure_future(http.post(url, json=body, headers=headers))
                assert await eventually(lambda: pinned.in_flight == 1, within_s=5.0)
                await asyncio.sleep(max(0.0, HELD_S - (time.monotonic() - started)))
                await post_fault(pinned.url, {"restart": True})
                async with await call as resp:
                    assert resp.status == 200
                    assert resp.headers["x-homing-worker"] == other.worker_id
                    raw = await resp.read()
        assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
        retried = [e for e in logs if e["event"] == "request_retried"]
        assert [e["worker"] for e in retried] == [pinned.worker_id]
        (done,) = [e for e in logs if e["event"] == "request_done"]
        assert (done["outcome"], done["worker"]) == ("ok", other.worker_id)
        assert done["ttft_ms"] >= HELD_S * 1000.0  # the client waited through both

        pinned_stats = app.recorder.replicas.snapshot(MODEL, pinned)
        assert (pinned_stats.requests, pinned_stats.error_ratio) == (2, 0.5)
        served = app.recorder.replicas.snapshot(MODEL, other)
        assert (served.requests, served.error_ratio) == (1, 0.0)
        assert served.ttft_per_uncached_token_s is not None and served.uncached_tokens > 0
        served_ttft_s = served.ttft_per_uncached_token_s * served.uncached_tokens
        assert 0.0 < served_ttft_s < HELD_S
