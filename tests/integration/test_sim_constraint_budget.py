"""A constraint whose instance is enormous (a named tool whose parameters need a hundred
million items, a regex repeated a billion times) is answered as a real engine answers it: the
first `max_tokens` tokens of an instance, finish "length", in a moment; and the workers that
served it go on serving (none is marked unhealthy, none failed a request)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from helpers import assert_ready_and_healthy

from homing.app import App

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECONDS = 10.0
"""A hang guard per request: one is served in well under a second (before the character
budget it held a worker's event loop for hours)."""

HUGE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "array", "minItems": 100_000_000, "items": {"type": "string"}}
            },
            "required": ["a"],
        },
    },
}


def _poisonous(app: App, **fields: Any) -> dict[str, Any]:
    """The named-tool request whose parameters reach the worker as a `json_schema`."""
    return {
        "model": app.model.model_id,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [HUGE_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        **fields,
    }


def _url(app: App) -> str:
    return f"http://127.0.0.1:{app.http_port}/v1/chat/completions"


async def _post(app: App, body: dict[str, Any]) -> tuple[int, Any]:
    async with asyncio.timeout(SECONDS), aiohttp.ClientSession() as session:
        async with session.post(_url(app), json=body) as resp:
            return resp.status, await resp.json()


async def _stream(app: App, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The status and the data chunks of a streamed request, up to `[DONE]`."""
    chunks: list[dict[str, Any]] = []
    async with asyncio.timeout(SECONDS), aiohttp.ClientSession() as session:
        async with session.post(_url(app), json={**body, "stream": True}) as resp:
            async for line in resp.content:
                data = line.decode().strip().removeprefix("data: ")
                if not data or line.startswith(b":"):
                    continue
                if data == "[DONE]":
                    break
                chunks.append(json.loads(data))
            return resp.status, chunks


async def _plain_chat_completes(app: App) -> None:
    status, body = await _post(
        app,
        {
            "model": app.model.model_id,
            "max_tokens": 20,
            "messages": [{"role": "user", "content": "hello"}],
        },
    )
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


async def test_a_tool_needing_a_huge_instance_is_cut_at_length_and_the_workers_serve_on(
    gateway: App,
) -> None:
    status, body = await _post(gateway, _poisonous(gateway))
    assert status == 200, body
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length", choice
    assert body["usage"]["completion_tokens"] == 50
    await assert_ready_and_healthy(gateway)
    await _plain_chat_completes(gateway)


async def test_streamed_the_huge_instance_is_cut_at_length_and_the_workers_serve_on(
    gateway: App,
) -> None:
    status, chunks = await _stream(gateway, _poisonous(gateway))
    assert status == 200, chunks
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert [f for f in finishes if f] == ["length"]
    await assert_ready_and_healthy(gateway)
    await _plain_chat_completes(gateway)


async def test_a_regex_repeated_a_billion_times_is_cut_at_length(gateway: App) -> None:
    """The same through a `response_format` JSON schema whose string has a pattern."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": "(ab{1000}){1000000}"}},
        "required": ["s"],
    }
    fields = {
        "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    status, body = await _post(
        gateway,
        {"model": gateway.model.model_id, "messages": [{"role": "user", "content": "x"}], **fields},
    )
    assert status == 200, body
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith('{"s": "abbb')
    await assert_ready_and_healthy(gateway)
