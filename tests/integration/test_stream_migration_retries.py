"""Stream migration's limits, over real simulated workers (faults through their sidecar):
a migration whose new worker fails before its first token is one more retry, on a worker
not tried yet, and the stream still ends whole; a constrained stream (`response_format`)
never migrates, since the new worker's grammar would start from its initial state, nor does
one that asked for log probabilities."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers import app_factory, eventually, greedy_ids, post_fault, worker_of_session
from structlog.testing import capture_logs

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
from homing.engines.pool import WorkerState

pytestmark = pytest.mark.asyncio

MODEL = "llama-3.1-8b"
MAX_TOKENS = 40
SESSION = "migrate-me"
PROMPT = "Tell me about routing requests to replicas."


def _config(workers: int, *extra_args: str) -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            health_interval_s=0.2,
            unhealthy_threshold=10_000,  # refusals never take a worker out of rotation
            breaker=BreakerSettings(enabled=False),
            outliers=OutlierSettings(enabled=False),
        ),
        router=RouterSettings(policy="consistent_hash", migrate_streams=True),
        sim=SimSettings(workers=workers, speedup=10.0, extra_args=list(extra_args)),
    )


@pytest_asyncio.fixture
async def make_app() -> AsyncIterator[Any]:
    """`await make_app(workers, *sim_args)`: a started App, stopped at the end."""
    async with app_factory(_config, clock=ManualClock) as make:
        yield make


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


async def _served_by(app: App) -> str:
    """The worker that serves a one-token request of `SESSION` now."""
    return await worker_of_session(app, MODEL, SESSION)


def _worker(app: App, worker_id: str) -> WorkerState:
    assert app.pool is not None
    (w,) = [w for w in app.pool.workers() if w.worker_id == worker_id]
    return w


def _texts(event: dict[str, Any]) -> list[str]:
    """The text an SSE chunk carries, completions or chat."""
    return [c.get("text") or (c.get("delta") or {}).get("content") or "" for c in event["choices"]]


async def _stream_and_crash(
    app: App, target: WorkerState, path: str, body: dict[str, Any]
) -> list[dict[str, Any]]:
    """Stream `body` on `path` pinned to `target` (slowed so tokens trickle), crash `target`
    once the client has read 3 events with text, read to the end: the JSON events."""
    await post_fault(target.url, {"slowdown": 200})
    lines: list[bytes] = []
    async with aiohttp.ClientSession() as http:
        async with http.post(_url(app, path), json=body, headers={"x-session-id": SESSION}) as resp:
            assert resp.status == 200
            assert resp.headers["x-homing-worker"] == target.worker_id
            texts = 0
            while texts < 3:
                line = await resp.content.readline()
                assert line, "the stream ended before the crash"
                lines.append(line)
                if line.startswith(b"data: {") and any(_texts(json.loads(line[6:]))):
                    texts += 1
            await post_fault(target.url, {"crash": True})
            lines.append(await resp.read())
    events = [e for e in b"".join(lines).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[6:]) for e in events[:-1]]


async def test_a_migration_whose_new_worker_fails_at_once_is_retried_on_a_third_worker(
    make_app: Any,
) -> None:
    """Three workers: the stream's worker A crashes after 3 tokens; the ring's next worker
    for its session, B, refuses every request (UNAVAILABLE); the migration to B is then
    retried on C (one `retried`, not the end of the stream): the client gets the healthy
    greedy text of all MAX_TOKENS tokens and `length`, no error; the request is logged `ok`
    on C; B's stats count the failed attempt as its error, and C's single record is its
    own attempt, whose input is the prompt plus the k tokens already produced."""
    app = await make_app(3)
    a = _worker(app, await _served_by(app))
    await post_fault(a.url, {"reject": "UNAVAILABLE"})
    b = _worker(app, await _served_by(app))  # where the session goes when A is excluded
    await post_fault(a.url, {"reject": None})
    assert await _served_by(app) == a.worker_id
    (c,) = [w for w in app.pool.workers() if w.worker_id not in (a.worker_id, b.worker_id)]
    await post_fault(b.url, {"reject": "UNAVAILABLE"})
    metrics = app.gateway_metrics
    retried_before = metrics.value("homing_retries_total", model=MODEL, outcome="retried")

    assert app.model is not None
    prompt = app.model.tokenizer.encode(PROMPT)
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with capture_logs() as logs:
        events = await _stream_and_crash(app, a, "/v1/completions", body)
    assert not any("error" in e for e in events)
    (migrated,) = [e for e in logs if e["event"] == "request_migrated"]
    assert (migrated["worker"], migrated["to_worker"]) == (a.worker_id, b.worker_id)
    (k,) = migrated["tokens"]
    assert 0 < k < MAX_TOKENS
    retried = [e for e in logs if e["event"] == "request_retried"]
    assert [(e["worker"], e["to_worker"], e["tokens"]) for e in retried] == [
        (b.worker_id, c.worker_id, [k])
    ]
    first = await greedy_ids(app, c.worker_id, prompt, MAX_TOKENS)
    rest = await greedy_ids(app, c.worker_id, prompt + first[:k], MAX_TOKENS - k)
    text = "".join(t for e in events for t in _texts(e))
    assert text == app.model.tokenizer.decode(first[:k] + rest)
    finishes = [c_["finish_reason"] for e in events for c_ in e["choices"] if c_["finish_reason"]]
    assert finishes == ["length"]
    assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    (done,) = [e for e in logs if e["event"] == "request_done"]
    assert (done["outcome"], done["worker"], done["migrated_from"]) == (
        "ok",
        c.worker_id,
        a.worker_id,
    )
    assert metrics.value("homing_stream_migrations_total", model=MODEL, outcome="migrated") == 1
    assert metrics.value("homing_retries_total", model=MODEL, outcome="retried") == (
        retried_before + 1
    )
    b_stats = app.recorder.replicas.snapshot(MODEL, b)
    assert (b_stats.requests, b_stats.error_ratio) == (2, 0.5)  # its probe, then the refusal
    c_stats = app.recorder.replicas.snapshot(MODEL, c)
    assert (c_stats.requests, c_stats.error_ratio) == (1, 0.0)
    assert c_stats.uncached_tokens == len(prompt) + k  # its own input, from an empty cache
    assert app.service is not None
    assert await eventually(lambda: app.service.in_flight == 0, within_s=2.0)
    for w in (a, b, c):
        assert app.model.open_leases(w.worker_id) == 0


SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


@pytest.mark.parametrize(
    ("fields", "outcome"),
    [
        ({"response_format": {"type": "json_object"}}, "constrained"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": SCHEMA},
                }
            },
            "constrained",
        ),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
    ],
    ids=["json_object", "json_schema", "logprobs"],
)
async def test_a_stream_that_cannot_resume_ends_with_the_error_event_unmigrated(
    make_app: Any, fields: dict[str, Any], outcome: str
) -> None:
    """With migrate_streams on, a chat stream with `response_format` (the new worker's
    grammar would start afresh) or log probabilities whose worker crashes mid-way ends with
    the same error event as without migration (503 `no_capacity`, "The worker failed: ...")
    after the text already sent: nothing migrates, the refusal is counted under its outcome
    and the request is logged `engine_error` on its worker. (The workers accept
    constraints: `--grammar-backend unconstrained`.)"""
    app = await make_app(2, "--grammar-backend", "unconstrained")
    target = _worker(app, await _served_by(app))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        **fields,
    }
    with capture_logs() as logs:
        events = await _stream_and_crash(app, target, "/v1/chat/completions", body)
    error = events[-1]
    assert set(error) == {"error"}
    assert error["error"]["message"].startswith("The worker failed: ")
    assert {key: v for key, v in error["error"].items() if key != "message"} == {
        "type": "service_unavailable_error",
        "param": None,
        "code": "no_capacity",
    }
    assert all("error" not in e for e in events[:-1])
    assert "".join(t for e in events[:-1] for t in _texts(e))
    assert not [e for e in logs if e["event"] in ("request_migrated", "request_retried")]
    (done,) = [e for e in logs if e["event"] == "request_done"]
    assert (done["outcome"], done["worker"]) == ("engine_error", target.worker_id)
    metrics = app.gateway_metrics
    migrations = {
        name: metrics.value("homing_stream_migrations_total", model=MODEL, outcome=name)
        for name in ("migrated", "constrained", "logprobs")
    }
    assert migrations == {"migrated": 0, "constrained": 0, "logprobs": 0, outcome: 1}
