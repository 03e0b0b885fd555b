"""A worker that restarts under a request which has sent the client nothing yet costs the
client nothing: the request runs again on another healthy replica (streamed: before its
first event; non-streamed: at any point before the answer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers import eventually, own_app, post_fault, worker_of_session
from structlog.testing import capture_logs

from homing.app import App
from homing.clock import ManualClock
from homing.config import EngineSettings, GatewaySettings, HomingConfig, RouterSettings, SimSettings
from homing.engines.pool import WorkerState
from homing.sim.metrics import scrape_total

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """Two simulated workers; sessions pinned to a worker by consistent hashing."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(health_interval_s=0.2),
        router=RouterSettings(policy="consistent_hash"),
        sim=SimSettings(workers=2, speedup=10.0),
    )
    async with own_app(config, clock=ManualClock()) as running:
        yield running


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


async def _worker_of(app: App, session_key: str) -> WorkerState:
    """The worker the session's requests go to (found with a short request)."""
    assert app.pool is not None
    worker_id = await worker_of_session(app, MODEL, session_key)
    return next(w for w in app.pool.workers() if w.worker_id == worker_id)


async def _fault(worker: WorkerState, body: dict[str, Any]) -> None:
    await post_fault(worker.url, body)


async def _generated(worker: WorkerState) -> float:
    """Tokens the worker has generated so far, from its own metrics (`sglang:generation_tokens`)."""
    port = int(worker.url.rsplit(":", 1)[1]) + 1
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            return scrape_total(await resp.text(), "sglang:generation_tokens_total")


async def _generates(worker: WorkerState, beyond: float) -> bool:
    """Whether the worker generates a token beyond `beyond` within 10 s."""
    for _ in range(200):
        if await _generated(worker) > beyond:
            return True
        await asyncio.sleep(0.05)
    return False


async def _settled(app: App) -> bool:
    """Both workers healthy, answering the pool's client and feeding it KV events again
    (a restarted worker's channel and event stream take a moment to come back: the app's
    virtual clock moves 0.1 s a round, for its health probes and reconnection backoff)."""
    assert app.pool is not None and isinstance(app.clock, ManualClock)
    pool, clock = app.pool, app.clock
    for _ in range(200):  # at most ~10 s of real time
        clock.advance(0.1)
        workers = pool.workers()
        if (
            len(workers) == 2
            and all(w.healthy and w.kv_stream == "open" for w in workers)
            and all([await pool.client(w.worker_id).health_check() for w in workers])
        ):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_stream_cut_by_a_restart_before_its_first_event_runs_on_another_worker(
    app: App,
) -> None:
    """A stream whose worker restarts before the first token reaches the client completes
    on the other worker, ends with [DONE], and logs one retry and an `ok` outcome."""
    assert await _settled(app)
    target = await _worker_of(app, "restart-stream")
    await _fault(target, {"stall_s": 30})  # the request waits in the engine, no token yet
    body = {"model": MODEL, "prompt": "Go", "max_tokens": 12, "ignore_eos": True, "stream": True}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as http:
            response = http.post(
                _url(app, "/v1/completions"), json=body, headers={"x-session-id": "restart-stream"}
            )
            pending = asyncio.ensure_future(response.__aenter__())
            assert await eventually(lambda: target.in_flight == 1, within_s=5.0)
            await _fault(target, {"restart": True})
            resp = await pending
            text = (await resp.read()).decode()
            served_by = resp.headers["x-homing-worker"]
            resp.release()
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert not any('"error"' in e for e in events)
    finishes = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:-1]]
    assert finishes[-1] == "length"
    assert served_by != target.worker_id
    retried = [e for e in logs if e["event"] == "request_retried"]
    assert [e["worker"] for e in retried] == [target.worker_id]
    done = [e for e in logs if e["event"] == "request_done"]
    assert [e["outcome"] for e in done] == ["ok"]
    assert await _settled(app)


async def test_non_streamed_request_cut_mid_generation_runs_again_elsewhere(app: App) -> None:
    """A non-streamed request whose worker restarts after producing tokens is answered whole
    by the other worker: exactly `max_tokens` tokens, no error."""
    assert app.service is not None
    assert await _settled(app)
    target = await _worker_of(app, "restart-plain")
    await _fault(target, {"slowdown": 200})  # tokens trickle out
    before = await _generated(target)
    body = {"model": MODEL, "prompt": "Go", "max_tokens": 20, "ignore_eos": True}

    with capture_logs() as logs:
        async with aiohttp.ClientSession() as http:
            call = asyncio.ensure_future(
                http.post(
                    _url(app, "/v1/completions"),
                    json=body,
                    headers={"x-session-id": "restart-plain"},
                )
            )
            assert await _generates(target, beyond=before), "no token came out"
            await _fault(target, {"restart": True})
            resp = await call
            status, answer = resp.status, await resp.json()
            served_by = resp.headers["x-homing-worker"]
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] == 20
    assert answer["choices"][0]["finish_reason"] == "length"
    assert served_by != target.worker_id
    assert [e["outcome"] for e in logs if e["event"] == "request_done"] == ["ok"]
    assert len([e for e in logs if e["event"] == "request_retried"]) == 1
    assert await _settled(app)
