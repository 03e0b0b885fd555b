"""The OpenAI-compatible HTTP API end to end: official `openai` client, SSE framing, n > 1,
stop strings, token-id prompts, prefix-cache reuse, and abort on client disconnect."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from helpers import eventually
from openai import AsyncOpenAI

from homing.app import App

pytestmark = pytest.mark.asyncio(loop_scope="module")

HELLO = [{"role": "user", "content": "Say hello in Chinese"}]


def _base(app: App) -> str:
    return f"http://127.0.0.1:{app.http_port}"


def _client(app: App) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=_base(app) + "/v1", api_key="unused", max_retries=0)


async def _model(app: App) -> str:
    models = await _client(app).models.list()
    return models.data[0].id


async def _sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    body = (await resp.read()).decode()
    assert body.endswith("\n\n")
    events = [block for block in body.split("\n\n") if block]
    assert all(e.startswith("data: ") for e in events)
    return [e.removeprefix("data: ") for e in events]


async def test_openai_client_streamed_and_non_streamed_text_are_equal(gateway: App) -> None:
    """At temperature 0 the official client gets the same text streamed and non-streamed."""
    client = _client(gateway)
    model = await _model(gateway)
    full = await client.chat.completions.create(
        model=model, messages=HELLO, temperature=0, max_tokens=64
    )
    text = full.choices[0].message.content
    assert text
    assert full.usage is not None and full.usage.completion_tokens > 0
    assert full.usage.prompt_tokens > 0
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    stream = await client.chat.completions.create(
        model=model,
        messages=HELLO,
        temperature=0,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts: list[str] = []
    usage = None
    roles = []
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                parts.append(choice.delta.content)
    assert "".join(parts) == text
    assert roles == ["assistant"]
    assert usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert "\ufffd" not in text


async def test_sse_stream_has_role_first_done_last_and_headers(gateway: App) -> None:
    """The raw SSE body: role delta first, finish chunk, `data: [DONE]` last, both headers."""
    model = await _model(gateway)
    body = {"model": model, "stream": True, "messages": HELLO, "max_tokens": 20}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            _base(gateway) + "/v1/chat/completions", json=body, headers={"x-request-id": "abc-1"}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            assert resp.headers["x-request-id"] == "abc-1"
            assert resp.headers["x-homing-worker"] in {w.worker_id for w in gateway.pool.workers()}
            events = await _sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(c["id"] == "chatcmpl-abc-1" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in {"stop", "length"}
    assert "usage" not in chunks[0]


async def test_n_choices_stream_with_their_own_index(gateway: App) -> None:
    """n=3 at temperature 1 streams three choices, each indexed and finished once."""
    client = _client(gateway)
    model = await _model(gateway)
    stream = await client.chat.completions.create(
        model=model, messages=HELLO, n=3, max_tokens=16, stream=True, temperature=1.0
    )
    texts = {0: "", 1: "", 2: ""}
    finished: list[int] = []
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.append(choice.index)
    assert sorted(finished) == [0, 1, 2]
    assert all(texts.values())

    full = await client.chat.completions.create(
        model=model, messages=HELLO, n=3, max_tokens=16, temperature=1.0
    )
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert all(c.message.content for c in full.choices)


async def test_stop_string_trims_text_and_finishes_with_stop(gateway: App) -> None:
    """A stop string found in the output ends the choice there, trimmed, reason "stop"."""
    client = _client(gateway)
    model = await _model(gateway)
    full = await client.completions.create(
        model=model,
        prompt="Once upon a time",
        max_tokens=60,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    text = full.choices[0].text
    assert len(text) > 20
    stop = text[10:14]
    expected = text[: text.index(stop)]
    for stream in (False, True):
        if stream:
            got = ""
            reasons = []
            async for chunk in await client.completions.create(
                model=model,
                prompt="Once upon a time",
                max_tokens=60,
                temperature=0,
                stop=[stop],
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                got += chunk.choices[0].text if chunk.choices else ""
                reasons += [c.finish_reason for c in chunk.choices if c.finish_reason]
            assert got == expected
            assert reasons == ["stop"]
        else:
            res = await client.completions.create(
                model=model,
                prompt="Once upon a time",
                max_tokens=60,
                temperature=0,
                stop=[stop],
                extra_body={"ignore_eos": True},
            )
            assert res.choices[0].text == expected
            assert res.choices[0].finish_reason == "stop"


async def test_token_id_prompt_honours_max_tokens_with_ignore_eos(gateway: App) -> None:
    """A token-id prompt with ignore_eos produces exactly max_tokens, reason "length"."""
    client = _client(gateway)
    model = await _model(gateway)
    res = await client.completions.create(
        model=model, prompt=list(range(1000, 1100)), max_tokens=25, extra_body={"ignore_eos": True}
    )
    assert res.usage is not None
    assert res.usage.prompt_tokens == 100
    assert res.usage.completion_tokens == 25
    assert res.choices[0].finish_reason == "length"


async def test_repeated_long_prompt_reports_cached_tokens(gateway: App) -> None:
    """The second identical long prompt is routed to the worker holding it and hits its cache."""
    model = await _model(gateway)
    prompt = [2000 + (i * 7919) % 90000 for i in range(1024)]
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(_base(gateway) + "/v1/completions", json=body) as resp:
            first = await resp.json()
            first_worker = resp.headers["x-homing-worker"]
        # Gate on the KV events having reached the router's index.
        assert gateway.router is not None
        index = gateway.router.index
        assert await eventually(lambda: index.match(prompt).get(first_worker, 0) >= 1024, 5)
        async with session.post(_base(gateway) + "/v1/completions", json=body) as resp:
            second = await resp.json()
            second_worker = resp.headers["x-homing-worker"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second_worker == first_worker
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 1008


async def test_client_disconnect_aborts_engine_request(gateway: App) -> None:
    """Closing the connection mid-stream aborts the engine request: within 1 s the workers'
    running counts and the gateway's in-flight count are 0."""
    model = await _model(gateway)
    body = {
        "model": model,
        "prompt": "Tell me a long story",
        "max_tokens": 100000,
        "ignore_eos": True,
        "stream": True,
    }
    session = aiohttp.ClientSession()
    resp = await session.post(_base(gateway) + "/v1/completions", json=body)
    assert resp.status == 200
    await resp.content.readline()  # the first event has arrived
    worker = resp.headers["x-homing-worker"]
    assert gateway.service.in_flight == 1
    loads = await gateway.pool.client(worker).loads()
    assert loads.loads[0].num_running_reqs == 1
    resp.close()
    await session.close()
    deadline = asyncio.get_running_loop().time() + 1.0
    while True:
        running = [
            (await gateway.pool.client(w.worker_id).loads()).loads[0].num_running_reqs
            for w in gateway.pool.workers()
        ]
        if gateway.service.in_flight == 0 and running == [0, 0]:
            break
        assert asyncio.get_running_loop().time() < deadline, (gateway.service.in_flight, running)
        await asyncio.sleep(0.05)
    assert all(w.in_flight == 0 for w in gateway.pool.workers())


async def test_models_health_and_ready(gateway: App) -> None:
    """`/v1/models` lists the served model; `/health` and `/ready` answer 200."""
    async with aiohttp.ClientSession() as session:
        async with session.get(_base(gateway) + "/v1/models") as resp:
            models = await resp.json()
            assert resp.headers["x-request-id"]
        async with session.get(_base(gateway) + "/health") as resp:
            assert resp.status == 200
        async with session.get(_base(gateway) + "/ready") as resp:
            ready = await resp.json()
            assert resp.status == 200
    assert models["object"] == "list"
    assert models["data"][0]["id"] == gateway.model.model_id
    assert models["data"][0]["max_model_len"] == gateway.model.max_context_length
    assert ready == {
        "ready": True,
        "healthy_workers": 2,
        "workers": 2,
        "models": {gateway.model.model_id: {"ready_workers": 2, "workers": 2}},
    }


async def test_repeated_client_request_id_never_aborts_another_request(gateway: App) -> None:
    """Four concurrent requests sharing one x-request-id all complete in full: the engine-side
    ids are the gateway's own."""
    model = await _model(gateway)
    body = {
        "model": model,
        "prompt": "Once",
        "max_tokens": 40,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with aiohttp.ClientSession() as session:

        async def one() -> dict:
            async with session.post(
                _base(gateway) + "/v1/completions", json=body, headers={"x-request-id": "retry-1"}
            ) as resp:
                assert resp.status == 200
                return await resp.json()

        results = await asyncio.gather(*(one() for _ in range(4)))
    assert [r["choices"][0]["finish_reason"] for r in results] == ["length"] * 4
    assert [r["usage"]["completion_tokens"] for r in results] == [40] * 4
    assert len({r["choices"][0]["text"] for r in results}) == 1


async def test_burst_of_cold_requests_spreads_across_workers(gateway: App) -> None:
    """16 concurrent requests without a shared prefix are split evenly: each dispatch is
    counted in flight before the next routing decision."""
    model = await _model(gateway)
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> str:
            prompt = [3000 + i * 97 + j for j in range(64)]
            body = {"model": model, "prompt": prompt, "max_tokens": 30, "ignore_eos": True}
            async with session.post(_base(gateway) + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()
                return resp.headers["x-homing-worker"]

        workers = await asyncio.gather(*(one(i) for i in range(16)))
    counts = sorted(workers.count(w) for w in set(workers))
    assert counts == [8, 8]


async def test_gateway_deadline_does_not_mark_workers_unhealthy(gateway: App) -> None:
    """A request that outlives the gateway's own deadline gets 504, is logged as `timeout`,
    and the worker that was serving it keeps its health."""
    from structlog.testing import capture_logs

    model = await _model(gateway)
    saved = gateway.service.request_timeout_s
    gateway.service.request_timeout_s = 0.3
    try:
        body = {"model": model, "prompt": "Tell", "max_tokens": 100000, "ignore_eos": True}
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as session:
                for _ in range(4):
                    async with session.post(_base(gateway) + "/v1/completions", json=body) as r:
                        assert r.status == 504
                        assert (await r.json())["error"]["code"] == "timeout"
    finally:
        gateway.service.request_timeout_s = saved
    done = [e["outcome"] for e in logs if e["event"] == "request_done"]
    assert done == ["timeout"] * 4
    assert all(w.healthy and w.consecutive_failures == 0 for w in gateway.pool.workers())
