"""A stream whose worker crashes after the client got tokens, over real simulated workers:
with `router.migrate_streams` it resumes on the other worker from the prompt plus the tokens
already produced and ends as the engine's own greedy continuation, no token repeated or lost;
without, it ends with the explicit error event (the default)."""

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
from homing.config import EngineSettings, GatewaySettings, HomingConfig, RouterSettings, SimSettings
from homing.engines.pool import WorkerState

pytestmark = pytest.mark.asyncio

MODEL = "llama-3.1-8b"
MAX_TOKENS = 40
SESSION = "migrate-me"


def _config(*, migrate: bool, final_tokens: str = "chunk_and_complete") -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(health_interval_s=0.2),
        router=RouterSettings(policy="consistent_hash", migrate_streams=migrate),
        sim=SimSettings(workers=2, speedup=10.0, extra_args=["--final-tokens", final_tokens]),
    )


@pytest_asyncio.fixture
async def make_app() -> AsyncIterator[Any]:
    """`await make_app(...)`: a started App over two fresh workers (one is crashed by each
    test), stopped at the end."""
    async with app_factory(_config, clock=ManualClock) as make:
        yield make


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


def _prompt(app: App) -> list[int]:
    assert app.model is not None
    return app.model.tokenizer.encode("Tell me about routing requests to replicas.")


async def _worker_of_session(app: App) -> tuple[WorkerState, WorkerState]:
    """(the worker `SESSION`'s requests go to, the other one), found with a short request."""
    assert app.pool is not None
    worker_id = await worker_of_session(app, MODEL, SESSION)
    first, second = app.pool.workers()
    return (first, second) if first.worker_id == worker_id else (second, first)


async def _stream_and_crash(
    app: App, target: WorkerState, **extra: Any
) -> tuple[str, list[dict[str, Any]]]:
    """Stream a greedy completion of `_prompt` (body fields `extra` added) pinned to
    `target`, crash `target` once the client has read 3 text events, and read to the end:
    (raw body, JSON events)."""
    await post_fault(target.url, {"slowdown": 200})  # tokens trickle out
    body = {
        "model": MODEL,
        "prompt": _prompt(app),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    lines: list[bytes] = []
    async with aiohttp.ClientSession() as http:
        async with http.post(
            _url(app, "/v1/completions"), json=body, headers={"x-session-id": SESSION}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["x-homing-worker"] == target.worker_id
            texts = 0
            while texts < 3:
                line = await resp.content.readline()
                assert line, "the stream ended before the crash"
                lines.append(line)
                if line.startswith(b"data: {") and b'"text":""' not in line:
                    texts += 1
            await post_fault(target.url, {"crash": True})
            lines.append(await resp.read())
    raw = b"".join(lines).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return raw, [json.loads(e[6:]) for e in events[:-1]]


@pytest.mark.parametrize("final_tokens", ["chunk_and_complete", "complete_only"])
async def test_a_stream_whose_worker_crashes_resumes_on_the_other_without_a_repeated_or_lost_token(
    make_app: Any, final_tokens: str
) -> None:
    """With migrate_streams, a greedy stream whose worker crashes after k tokens reached the
    client completes on the other worker: its text is exactly the decode of the healthy
    worker's greedy first k tokens followed by that worker's greedy continuation of prompt +
    those k tokens (MAX_TOKENS - k of them), with `length` as its one finish; usage counts
    the original prompt and every token delivered; the request is logged `ok` on the new
    worker with the migration, counted once, and both leases are released."""
    app = await make_app(migrate=True, final_tokens=final_tokens)
    target, other = await _worker_of_session(app)
    with capture_logs() as logs:
        _, events = await _stream_and_crash(app, target)
    assert not any("error" in e for e in events)
    migrated = [e for e in logs if e["event"] == "request_migrated"]
    assert len(migrated) == 1
    entry = migrated[0]
    assert (entry["worker"], entry["to_worker"], entry["choices"]) == (
        target.worker_id,
        other.worker_id,
        [0],
    )
    (k,) = entry["tokens"]
    assert 0 < k < MAX_TOKENS

    prompt = _prompt(app)
    first = await greedy_ids(app, other.worker_id, prompt, MAX_TOKENS)  # a healthy worker's answer
    rest = await greedy_ids(app, other.worker_id, prompt + first[:k], MAX_TOKENS - k)
    assert app.model is not None
    expected = app.model.tokenizer.decode(first[:k] + rest)
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == expected
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    assert events[-1]["usage"]["prompt_tokens"] == len(prompt)
    assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS

    done = [e for e in logs if e["event"] == "request_done"]
    assert [(e["outcome"], e["worker"], e.get("migrated_from")) for e in done] == [
        ("ok", other.worker_id, target.worker_id)
    ]
    assert done[0]["completion_tokens"] == MAX_TOKENS
    metrics = app.gateway_metrics
    assert metrics.value("homing_stream_migrations_total", model=MODEL, outcome="migrated") == 1
    assert app.service is not None and app.model is not None
    assert await eventually(lambda: app.service.in_flight == 0, within_s=2.0)
    assert app.model.open_leases(target.worker_id) == 0
    assert app.model.open_leases(other.worker_id) == 0
    assert other.in_flight == 0


async def test_every_choice_of_a_stream_migrates_and_its_stop_string_still_ends_it(
    make_app: Any,
) -> None:
    """With n=2 and the stop string ".", both choices of a stream whose worker crashes move to
    the other worker (one lease of 2 slots), and each ends with `stop` exactly before the
    first "." of its continued text (the stop matcher runs on across the boundary): its text
    is the decode of the healthy greedy first k_i tokens plus the continuation of prompt +
    those, cut before the ".", which comes only after the migration."""
    app = await make_app(migrate=True)
    target, other = await _worker_of_session(app)
    with capture_logs() as logs:
        _, events = await _stream_and_crash(app, target, n=2, stop=["."])
    assert not any("error" in e for e in events)
    (entry,) = [e for e in logs if e["event"] == "request_migrated"]
    assert (entry["to_worker"], entry["choices"]) == (other.worker_id, [0, 1])
    prompt = _prompt(app)
    first = await greedy_ids(app, other.worker_id, prompt, MAX_TOKENS)
    assert app.model is not None
    tokenizer = app.model.tokenizer
    for index, k in enumerate(entry["tokens"]):
        assert "." not in tokenizer.decode(first[:k])
        rest = await greedy_ids(app, other.worker_id, prompt + first[:k], MAX_TOKENS - k)
        whole = tokenizer.decode(first[:k] + rest)
        assert "." in whole
        text = "".join(c["text"] for e in events for c in e["choices"] if c["index"] == index)
        assert text == whole.split(".")[0]
        finishes = [
            c["finish_reason"]
            for e in events
            for c in e["choices"]
            if c["index"] == index and c["finish_reason"]
        ]
        assert finishes == ["stop"]
    done = [e for e in logs if e["event"] == "request_done"]
    assert [(e["outcome"], e["worker"]) for e in done] == [("ok", other.worker_id)]
    assert app.model.open_leases(target.worker_id) == app.model.open_leases(other.worker_id) == 0


async def test_without_migration_a_stream_whose_worker_crashes_ends_with_the_error_event(
    make_app: Any,
) -> None:
    """By default a stream whose worker crashes mid-way ends with the OpenAI error event
    (503 `no_capacity`, "The worker failed: ...") right before `[DONE]`, after the text
    already sent; nothing migrates and the request is logged `engine_error`."""
    app = await make_app(migrate=False)
    target, _ = await _worker_of_session(app)
    with capture_logs() as logs:
        _, events = await _stream_and_crash(app, target)
    error = events[-1]
    assert set(error) == {"error"}
    assert error["error"]["message"].startswith("The worker failed: ")
    assert {k: v for k, v in error["error"].items() if k != "message"} == {
        "type": "service_unavailable_error",
        "param": None,
        "code": "no_capacity",
    }
    assert all("error" not in e for e in events[:-1])
    assert "".join(c["text"] for e in events[:-1] for c in e["choices"])
    assert not [e for e in logs if e["event"] == "request_migrated"]
    done = [e for e in logs if e["event"] == "request_done"]
    assert [(e["outcome"], e["worker"]) for e in done] == [("engine_error", target.worker_id)]
    metrics = app.gateway_metrics
    assert metrics.value("homing_stream_migrations_total", model=MODEL, outcome="migrated") == 0
