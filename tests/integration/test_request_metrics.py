"""After a known mix of requests, `/metrics` holds exactly what they did: outcomes, SLO
verdicts, goodput tokens and histogram counts and sums; a worker that leaves leaves no
labelled series behind.

The mix, over two simulated workers (sessions pinned by consistent hashing): requests on the
fast worker meet the SLO; streamed ones on a worker slowed 200x miss it (TPOT ~0.1 s against
0.05 s); one request is cancelled while its worker stalls (no token: outside the SLO); one
fails mid-way when its worker restarts under it (failed, never a success); two are refused
(400, 404)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from helpers import own_app, post_fault
from structlog.testing import capture_logs

from homing.app import App
from homing.config import (
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    ModelSettings,
    RouterSettings,
    SimSettings,
    SloSettings,
)
from homing.engines.pool import WorkerState

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"
VERSION = "v7"
PROMPT = "the same prompt for every request"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(health_interval_s=0.2),
        router=RouterSettings(policy="consistent_hash"),
        sim=SimSettings(workers=2, speedup=10.0),
        models=[ModelSettings(version=VERSION, slo=SloSettings(objective=0.9))],
    )
    async with own_app(config) as running:
        yield running


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


def _value(app: App, name: str, **labels: str) -> float:
    return app.gateway_metrics.registry.get_sample_value(name, labels) or 0.0


def _labels(worker: str) -> dict[str, str]:
    return {"model": MODEL, "version": VERSION, "worker": worker}


async def _fault(worker: WorkerState, body: dict[str, Any]) -> None:
    await post_fault(worker.url, body)


async def _complete(
    http: aiohttp.ClientSession, app: App, session: str, *, stream: bool, max_tokens: int
) -> dict[str, Any]:
    """One request to the session's worker: its worker, usage and chunk count."""
    body: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens,
                            "ignore_eos": True, "stream": stream}  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with http.post(
        _url(app, "/v1/completions"), json=body, headers={"x-session-id": session}
    ) as resp:
        assert resp.status == 200, await resp.text()
        worker = resp.headers["x-homing-worker"]
        if not stream:
            return {"worker": worker, "usage": (await resp.json())["usage"]}
        usage = None
        async for line in resp.content:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
        return {"worker": worker, "usage": usage}


async def _sessions(http: aiohttp.ClientSession, app: App) -> dict[str, str]:
    """A session key pinned to each worker (worker id -> key), found with 1-token probes."""
    found: dict[str, str] = {}
    for i in range(64):
        r = await _complete(http, app, f"s{i}", stream=False, max_tokens=1)
        found.setdefault(r["worker"], f"s{i}")
        if len(found) == 2:
            return found
    raise AssertionError(f"consistent hashing sent 64 sessions to {sorted(found)}")


async def test_metrics_match_a_known_mix_of_requests_exactly(app: App) -> None:
    assert app.pool is not None
    states = {w.worker_id: w for w in app.pool.workers()}
    async with aiohttp.ClientSession() as http:
        sessions = await _sessions(http, app)
        fast, slow = sorted(sessions)
        probes_fast = _value(app, "homing_requests_total", **_labels(fast), outcome="ok",
                             finish_reason="length")  # fmt: skip
        probes_slow = _value(app, "homing_requests_total", **_labels(slow), outcome="ok",
                             finish_reason="length")  # fmt: skip
        probes = probes_fast + probes_slow
        prompt_tokens = (
            _value(app, "homing_request_prompt_tokens_sum", **_labels(fast)) / probes_fast
        )

        with capture_logs() as logs:
            met = [
                await _complete(http, app, sessions[fast], stream=s, max_tokens=8)
                for s in (False, False, False, False, True, True, True)
            ]

            # Cancelled while its worker stalls: no token reached the gateway.
            await _fault(states[slow], {"stall_s": 30})
            cancelled = asyncio.ensure_future(
                _complete(http, app, sessions[slow], stream=False, max_tokens=8)
            )
            await _until(lambda: states[slow].in_flight == 1)
            cancelled.cancel()
            await asyncio.gather(cancelled, return_exceptions=True)
            await _until(lambda: states[slow].in_flight == 0)
            await _fault(states[slow], {})

            await _fault(states[slow], {"slowdown": 200})
            missed = [
                await _complete(http, app, sessions[slow], stream=True, max_tokens=4)
                for _ in range(2)
            ]

            # Fails mid-way: three tokens reached the client, then the worker restarts.
            failed_tokens = 0
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 60, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            async with http.post(
                _url(app, "/v1/completions"), json=body, headers={"x-session-id": sessions[slow]}
            ) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                        failed_tokens += 1
                        if failed_tokens == 3:
                            await _fault(states[slow], {"restart": True})
                # the stream ends with an error event, never [DONE]
                assert failed_tokens >= 3

            async with http.post(_url(app, "/v1/completions"), json={"model": MODEL}) as resp:
                assert resp.status == 400
            async with http.post(
                _url(app, "/v1/completions"), json={"model": "nope", "prompt": "x"}
            ) as resp:
                assert resp.status == 404

    done = [e for e in logs if e["event"] == "request_done"]
    # The cancelled one (a whole answer: its allowance is never known) is outside the SLO.
    assert [e["slo"] for e in done] == (
        ["met"] * 7 + [None] + ["missed"] * 2 + ["failed"] + [None, None]
    )
    # A whole (non-streamed) answer has no TTFT or TPOT: judged on its end-to-end time.
    assert [e["ttft_ms"] is None for e in done[:7]] == [True] * 4 + [False] * 3
    assert [e["outcome"] for e in done][7:] == [
        "client_closed", "ok", "ok", "engine_error", "error_400", "error_404"
    ]  # fmt: skip

    assert all(r["worker"] == fast for r in met) and all(r["worker"] == slow for r in missed)
    ok = met + missed
    v = lambda name, **labels: _value(app, name, **labels)  # noqa: E731
    fl, sl = _labels(fast), _labels(slow)
    # outcomes, by worker
    assert v("homing_requests_total", **fl, outcome="ok", finish_reason="length") == probes_fast + 7
    assert v("homing_requests_total", **sl, outcome="ok", finish_reason="length") == probes_slow + 2
    assert v("homing_requests_total", **sl, outcome="client_closed", finish_reason="") == 1
    assert v("homing_requests_total", **sl, outcome="engine_error", finish_reason="") == 1
    refused = {"model": "", "version": "", "worker": "", "finish_reason": ""}
    assert v("homing_requests_total", **refused, outcome="missing_required_parameter") == 1
    assert v("homing_requests_total", **refused, outcome="model_not_found") == 1
    # SLO verdicts and goodput (the probes met it too: one token each, at once)
    slo = {"model": MODEL, "version": VERSION}
    assert v("homing_slo_requests_total", **slo, verdict="met") == probes + 7
    assert v("homing_slo_requests_total", **slo, verdict="missed") == 2
    assert v("homing_slo_requests_total", **slo, verdict="failed") == 1
    met_tokens = sum(r["usage"]["completion_tokens"] for r in met)
    assert met_tokens == 7 * 8
    assert v("homing_slo_goodput_tokens_total", **slo) == probes + met_tokens
    judged = probes + 7 + 2 + 1
    assert v("homing_slo_attainment_ratio", model=MODEL) == pytest.approx((probes + 7) / judged)
    assert v("homing_slo_objective", model=MODEL) == 0.9  # the model's own SLO
    assert v("homing_slo_ttft_seconds", model=MODEL) == 0.5
    assert v("homing_slo_tpot_seconds", model=MODEL) == 0.05
    assert v("homing_slo_ttft_p95_seconds", model=MODEL) == 0.5
    assert v("homing_slo_tpot_p95_seconds", model=MODEL) == 0.05
    burn = (judged - probes - 7) / judged / (1 - 0.9)
    assert v("homing_slo_burn_rate", model=MODEL, window="5m") == pytest.approx(burn)
    assert v("homing_slo_burn_rate", model=MODEL, window="6h") == pytest.approx(burn)
    # histograms: one observation per request that reached the point measured
    routed = probes + 7 + 1 + 2 + 1
    count = lambda name, labels: v(f"{name}_count", **labels)  # noqa: E731
    both = lambda name: count(name, fl) + count(name, sl)  # noqa: E731
    assert both("homing_request_e2e_seconds") == routed
    assert v("homing_request_e2e_seconds_count", model="", version="", worker="") == 2
    assert both("homing_request_queue_seconds") == routed
    # streamed ones only (whole answers' first-token times are not known); the cancelled
    # one had none
    assert both("homing_request_ttft_seconds") == 3 + 2 + 1
    assert both("homing_request_tpot_seconds") == 3 + 2 + 1  # streamed, >= 2 tokens
    assert both("homing_request_prompt_tokens") == routed
    sums = lambda name: v(f"{name}_sum", **fl) + v(f"{name}_sum", **sl)  # noqa: E731
    assert sums("homing_request_prompt_tokens") == routed * prompt_tokens
    assert all(r["usage"]["prompt_tokens"] == prompt_tokens for r in ok)
    served_tokens = probes + sum(r["usage"]["completion_tokens"] for r in ok)
    failed_counted = sums("homing_request_completion_tokens") - served_tokens
    assert 3 <= failed_counted <= 60  # what the failed stream had received
    assert done[10]["completion_tokens"] == failed_counted
    assert (
        v("homing_generation_tokens_total", **fl) + v("homing_generation_tokens_total", **sl)
        == served_tokens + failed_counted
    )
    assert (
        v("homing_prompt_tokens_total", **fl) + v("homing_prompt_tokens_total", **sl)
        == routed * prompt_tokens
    )
    assert v("homing_requests_in_flight", model=MODEL) == 0
    # the per-worker snapshot saw the failure on the slow worker only
    snapshots = {s.worker_id: s for s in app.recorder.snapshots(MODEL)}
    assert snapshots[fast].error_ratio == 0.0
    assert snapshots[slow].error_ratio is not None and snapshots[slow].error_ratio > 0


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_a_traceparent_reaches_the_log_line_with_the_engine_request_id(app: App) -> None:
    """Over HTTP and gRPC; an invalid one is ignored (the request is served, no trace id)."""
    from homing.v1 import inference_pb2 as pb
    from homing.v1 import inference_pb2_grpc as pb_grpc

    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as http:
            for value in (TRACEPARENT, "00-00000000000000000000000000000000-00f067aa0ba902b7-01"):
                async with http.post(
                    _url(app, "/v1/completions"), json=body, headers={"traceparent": value}
                ) as resp:
                    assert resp.status == 200
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            call = pb_grpc.InferenceStub(channel).Completion(
                pb.CompletionRequest(
                    model=MODEL, text=PROMPT, sampling=pb.SamplingOptions(max_tokens=2)
                ),
                metadata=(("traceparent", TRACEPARENT),),
            )
            assert [c async for c in call]
    done = [e for e in logs if e["event"] == "request_done"]
    assert [e.get("trace_id") for e in done] == [
        "4bf92f3577b34da6a3ce929d0e0e4736", None, "4bf92f3577b34da6a3ce929d0e0e4736"
    ]  # fmt: skip
    assert done[0]["parent_span_id"] == "00f067aa0ba902b7"
    assert all(len(e["engine_request_id"]) == 32 for e in done)
    assert len({e["engine_request_id"] for e in done}) == 3


async def test_a_removed_worker_leaves_no_labelled_series(app: App) -> None:
    """Removed with a stream in flight: the stream ends (`worker_removed`, counted without
    the worker's label) and no series names the worker afterwards."""
    assert app.pool is not None and app.fleet is not None
    pool = app.pool
    # the first test restarted a worker: both route again once healthy
    await _until(lambda: all(w.routable and w.kv_stream == "open" for w in pool.workers()), 20)
    states = {w.worker_id: w for w in pool.workers()}
    async with aiohttp.ClientSession() as http:
        sessions = await _sessions(http, app)
        for _i in range(4):  # both workers have served something
            for session in sessions.values():
                await _complete(http, app, session, stream=True, max_tokens=2)
        gone = sorted(sessions)[-1]
        await _fault(states[gone], {"slowdown": 200})
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True,
                "stream": True}  # fmt: skip
        with capture_logs() as logs:
            async with http.post(
                _url(app, "/v1/completions"), json=body, headers={"x-session-id": sessions[gone]}
            ) as resp:
                assert resp.status == 200
                text = (await _scrape(app)).decode()
                assert f'worker="{gone}"' in text
                await app.fleet.remove(gone, force=True)
                await resp.read()  # the cut stream ends
    await _until(lambda: all(w.worker_id != gone for w in app.pool.workers()))
    [cut] = [e for e in logs if e["event"] == "request_done"]
    assert cut["outcome"] == "worker_removed" and cut["slo"] == "failed"
    text = (await _scrape(app)).decode()
    assert f'worker="{gone}"' not in text, [
        line for line in text.splitlines() if f'worker="{gone}"' in line
    ]
    assert 'worker="' in text  # the other worker's series are still there
    assert _value(app, "homing_requests_total", model=MODEL, version=VERSION, worker="",
                  outcome="worker_removed", finish_reason="") == 1  # fmt: skip
    assert _value(app, "homing_requests_in_flight", model=MODEL) == 0


async def _scrape(app: App) -> bytes:
    async with aiohttp.ClientSession() as http:
        async with http.get(_url(app, "/metrics")) as resp:
            assert resp.status == 200
            return await resp.read()


async def _until(check: Any, within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_flood_of_scrapes_is_answered_from_the_latest_exposition(app: App) -> None:
    """At most 4 expositions are built a second; past that a scrape gets the latest, and a
    later one shows what happened meanwhile."""
    labels = 'outcome="model_not_found"'

    def refused(text: bytes) -> float:
        for line in text.decode().splitlines():
            if line.startswith("homing_requests_total{") and labels in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    async with aiohttp.ClientSession() as http:
        bodies = [await _scrape(app) for _ in range(4)]
        before = refused(bodies[-1])
        async with http.post(
            _url(app, "/v1/completions"), json={"model": "nope", "prompt": "x"}
        ) as resp:
            assert resp.status == 404
        flooded = [await _scrape(app) for _ in range(20)]
    assert any(refused(b) == before for b in flooded)  # answered from the latest
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while refused(await _scrape(app)) != before + 1:  # a second later: fresh again
        assert loop.time() < deadline
        await asyncio.sleep(0.05)
