"""Retries of refused Generates over real simulated workers: a request one worker refuses
with UNAVAILABLE is answered by the other (one response, one retry); when every worker
refuses, the model's retry budget stops the retries, so the pool's load does not double."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
import pytest_asyncio
from helpers import own_app, post_fault
from structlog.testing import capture_logs

from homing.app import App
from homing.clock import ManualClock
from homing.config import HomingConfig, RouterSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"
REFUSAL = "injected fault: this worker answers UNAVAILABLE"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(
    retry_config: Callable[[RouterSettings], HomingConfig],
) -> AsyncIterator[App]:
    """Two workers, default retry budget; sessions pinned by consistent hashing."""
    async with own_app(
        retry_config(RouterSettings(policy="consistent_hash")), clock=ManualClock()
    ) as running:
        yield running


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


def _retries(app: App, outcome: str) -> float:
    return app.gateway_metrics.value("homing_retries_total", model=MODEL, outcome=outcome)


async def _sessions_on(app: App, worker_id: str, count: int) -> list[str]:
    """`count` session keys whose requests the router sends to `worker_id`."""
    found: list[str] = []
    body = {"model": MODEL, "prompt": "probe", "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        for i in range(200):
            key = f"pin-{i}"
            async with http.post(
                _url(app, "/v1/completions"), json=body, headers={"x-session-id": key}
            ) as resp:
                assert resp.status == 200
                if resp.headers["x-homing-worker"] == worker_id:
                    found.append(key)
            if len(found) == count:
                return found
    raise AssertionError(f"no {count} sessions route to {worker_id}")


async def test_each_request_refused_by_one_worker_is_answered_once_by_the_other(
    app: App,
) -> None:
    """With one worker refusing every Generate (UNAVAILABLE), each request routed to it,
    streamed or not, is retried once on the other worker: the client gets one 200 answer
    from the other worker (a stream with no error event), and each retry is logged and
    counted."""
    assert app.pool is not None
    refusing, healthy = app.pool.workers()
    sessions = await _sessions_on(app, refusing.worker_id, 6)
    await post_fault(refusing.url, {"reject": "UNAVAILABLE"})
    retried_before = _retries(app, "retried")
    try:
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as http:
                for i, key in enumerate(sessions):
                    stream = i % 2 == 1
                    body = {
                        "model": MODEL,
                        "prompt": f"question {i}",
                        "max_tokens": 8,
                        "ignore_eos": True,
                        "stream": stream,
                    }
                    async with http.post(
                        _url(app, "/v1/completions"), json=body, headers={"x-session-id": key}
                    ) as resp:
                        assert resp.status == 200, await resp.text()
                        assert resp.headers["x-homing-worker"] == healthy.worker_id
                        raw = (await resp.read()).decode()
                    if stream:
                        events = [e for e in raw.split("\n\n") if e]
                        assert events[-1] == "data: [DONE]"
                        assert not any('"error"' in e for e in events)
                        finishes = [
                            json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:-1]
                        ]
                        assert finishes[-1] == "length"
                    else:
                        answer = json.loads(raw)
                        assert answer["usage"]["completion_tokens"] == 8
    finally:
        await post_fault(refusing.url, {"reject": None})
    retried = [e for e in logs if e["event"] == "request_retried"]
    assert [(e["worker"], e["code"]) for e in retried] == [
        (refusing.worker_id, "UNAVAILABLE")
    ] * len(sessions)
    done = [e for e in logs if e["event"] == "request_done"]
    assert [(e["outcome"], e["worker"]) for e in done] == [("ok", healthy.worker_id)] * len(
        sessions
    )
    assert _retries(app, "retried") - retried_before == len(sessions)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tight_app(
    retry_config: Callable[[RouterSettings], HomingConfig],
) -> AsyncIterator[App]:
    """Two workers; retry budget 0.2 of requests plus 0.1 retries/s over 10 s (a floor of
    one retry)."""
    router = RouterSettings(
        policy="round_robin",
        max_retries=1,
        retry_budget_ratio=0.2,
        retry_min_per_s=0.1,
        retry_window_s=10.0,
    )
    async with own_app(retry_config(router), clock=ManualClock()) as running:
        yield running


async def test_when_every_worker_refuses_retries_stop_at_the_budget(tight_app: App) -> None:
    """With both workers refusing every Generate, 30 requests in a row make exactly the
    retries the budget allows (0.2 per request plus a floor of 1: 7), not 30: the workers
    see 37 attempts instead of 60. Every client gets one 503 with the first refusal's
    message; the refusals past the budget are counted as `budget_exhausted`, the retried
    requests' second failures as `max_retries`."""
    app = tight_app
    assert app.pool is not None
    workers = app.pool.workers()
    requests = 30
    expected = 0  # the budget's rule, replayed: retries + 1 <= 0.2 * requests + 1
    for k in range(1, requests + 1):
        if expected + 1 <= 0.2 * k + 0.1 * 10.0 + 1e-9:
            expected += 1
    assert expected == 7
    for worker in workers:
        await post_fault(worker.url, {"reject": "UNAVAILABLE"})
    try:
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as http:
                for i in range(requests):
                    body = {"model": MODEL, "prompt": f"q{i}", "max_tokens": 4}
                    async with http.post(_url(app, "/v1/completions"), json=body) as resp:
                        status, answer = resp.status, await resp.json()
                    assert status == 503, answer
                    assert answer["error"]["code"] == "no_capacity"
                    assert answer["error"]["message"] == f"The worker failed: {REFUSAL}"
    finally:
        for worker in workers:
            await post_fault(worker.url, {"reject": None})
    retried = [e for e in logs if e["event"] == "request_retried"]
    assert len(retried) == expected
    assert _retries(app, "retried") == expected
    assert _retries(app, "budget_exhausted") == requests - expected
    assert _retries(app, "max_retries") == expected
    assert _retries(app, "no_other_worker") == 0
    attempts = requests + len(retried)
    assert attempts == 37 <= 0.2 * requests + 1 + requests
    done = [e for e in logs if e["event"] == "request_done"]
    assert [e["outcome"] for e in done] == ["engine_error"] * requests
