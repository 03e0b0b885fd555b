"""A worker that refuses a request with RESOURCE_EXHAUSTED (its queue is full) before the
first byte does not fail the client while another worker has room: the request is retried
there; only when every worker refuses does the client get the worker's 429, body unchanged.
Over real simulated workers, the refusals injected through their fault sidecar."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from helpers import own_app, post_fault

from homing.app import App
from homing.clock import ManualClock
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
REQUESTS = 10

FULL_BODY = {
    "error": {
        "message": (
            "The worker is out of capacity: injected fault: this worker answers RESOURCE_EXHAUSTED"
        ),
        "type": "rate_limit_error",
        "param": None,
        "code": None,
    }
}


def _config() -> HomingConfig:
    # No health flip, breaker or ejection: the refusing worker stays in rotation, so every
    # request routed to it is a refusal the gateway has to deal with.
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            health_interval_s=0.2,
            unhealthy_threshold=10_000,
            breaker=BreakerSettings(enabled=False),
            outliers=OutlierSettings(enabled=False),
        ),
        router=RouterSettings(policy="round_robin"),
        sim=SimSettings(workers=2, speedup=10.0),
    )


async def _post(app: App, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body) as resp:
            return resp.status, dict(resp.headers), await resp.read()


@pytest.mark.parametrize("stream", [False, True])
async def test_requests_a_full_worker_refuses_succeed_on_the_worker_with_room(
    stream: bool,
) -> None:
    """With one of two workers answering RESOURCE_EXHAUSTED to every Generate, all of
    `REQUESTS` concurrent requests succeed on the other (round robin sends about half to the
    full one): each refusal is one `retried`, and no refusal counts as the full worker's error
    (a full worker is not a failing one, so outlier ejection never acts on it)."""
    async with own_app(_config(), clock=ManualClock()) as app:
        assert app.pool is not None
        full, roomy = app.pool.workers()
        await post_fault(full.url, {"reject": "RESOURCE_EXHAUSTED"})
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 4, "stream": stream}
        results = await asyncio.gather(*(_post(app, body) for _ in range(REQUESTS)))
        assert [status for status, _, _ in results] == [200] * REQUESTS
        assert {headers["x-homing-worker"] for _, headers, _ in results} == {roomy.worker_id}
        metrics = app.gateway_metrics
        retried = metrics.value("homing_retries_total", model=MODEL, outcome="retried")
        assert retried >= 1
        for outcome in ("budget_exhausted", "no_other_worker", "max_retries"):
            assert metrics.value("homing_retries_total", model=MODEL, outcome=outcome) == 0
        full_stats = app.recorder.replicas.snapshot(MODEL, full)
        roomy_stats = app.recorder.replicas.snapshot(MODEL, roomy)
        assert (full_stats.requests, full_stats.error_ratio) == (0, None)
        assert (roomy_stats.requests, roomy_stats.error_ratio) == (REQUESTS, 0.0)


@pytest.mark.parametrize("stream", [False, True])
async def test_when_every_worker_is_full_the_client_gets_the_worker_429_unchanged(
    stream: bool,
) -> None:
    """With both workers answering RESOURCE_EXHAUSTED, the request is tried on each (one
    `retried`, then `no_other_worker`) and the client gets 429 `rate_limit_error` with
    `Retry-After: 1` and the body a single refusal gives."""
    async with own_app(_config(), clock=ManualClock()) as app:
        assert app.pool is not None
        for w in app.pool.workers():
            await post_fault(w.url, {"reject": "RESOURCE_EXHAUSTED"})
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 4, "stream": stream}
        status, headers, raw = await _post(app, body)
        assert status == 429
        assert headers["Retry-After"] == "1"
        assert json.loads(raw) == FULL_BODY
        metrics = app.gateway_metrics
        assert metrics.value("homing_retries_total", model=MODEL, outcome="retried") == 1
        assert metrics.value("homing_retries_total", model=MODEL, outcome="no_other_worker") == 1
