"""Tokenizing a prompt never holds the gateway's event loop: a chat whose tokenizing costs more
than a few milliseconds, by its length or by its number of messages, is tokenized in a worker
thread.

Rule of the file: real gateway, real simulated workers (the `gateway` fixture) in this test's
event loop; the request goes over a real socket while `LoopWatch` times every loop callback
in thread CPU time, and the served tokenizer's `encode_chat` is wrapped (it still runs) to
record the thread it ran on.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

import aiohttp
import pytest
from loop_watch import Callbacks, LoopWatch

from homing.app import App
from homing.config import GatewaySettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOOP_BUDGET_MS = 10.0
# Half the most messages a chat may hold (2,048): its ~2 ms of body parsing on the loop leave
# room for the claim, and tokenizing it (~15 ms) on the loop would break it.
MESSAGES = GatewaySettings().max_messages // 2


async def _chat(app: App, messages: list[dict[str, str]]) -> tuple[int, Any]:
    body = {"model": app.model.model_id, "messages": messages, "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/chat/completions", json=body
        ) as resp:
            return resp.status, await resp.json()


@pytest.fixture
def encode_threads(gateway: App, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Ids of the threads the served tokenizer's `encode_chat` ran on, one per call."""
    tokenizer = gateway.model.tokenizer
    encode_chat = tokenizer.encode_chat
    threads: list[int] = []

    def recorded(*args: Any, **kwargs: Any) -> list[int]:
        threads.append(threading.get_ident())
        return encode_chat(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode_chat", recorded)
    return threads


async def test_many_small_messages_are_tokenized_off_the_event_loop(
    gateway: App, encode_threads: list[int]
) -> None:
    """1,024 messages of 4 characters (~15 ms to tokenize) are encoded in a worker thread,
    and no loop callback takes 10 ms of CPU while the request is served.

    Sent 3 times; asserted is the median of each request's longest callback, as one reading
    of thread CPU time has a tail on a shared VM (see `test_stop_limits`), while tokenizing
    on the loop would hold it ~15 ms every time.
    """
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "abcd"} for i in range(MESSAGES)
    ]
    served: list[Callbacks] = []
    with LoopWatch() as watch:
        for _ in range(3):
            with watch.recording() as callbacks:
                status, body = await _chat(gateway, messages)
            assert status == 200, body
            assert body["usage"]["prompt_tokens"] > MESSAGES
            served.append(callbacks)
    assert len(encode_threads) == 3
    assert threading.get_ident() not in encode_threads
    longest = statistics.median(callbacks.longest_ms for callbacks in served)
    assert longest < LOOP_BUDGET_MS, "; ".join(
        f"{c.longest_ms:.1f} ms: {c.longest}" for c in served
    )


async def test_a_short_chat_is_tokenized_on_the_event_loop(
    gateway: App, encode_threads: list[int]
) -> None:
    """A one-message chat is encoded inline: a thread hop would cost it more than encoding."""
    status, body = await _chat(gateway, [{"role": "user", "content": "Hello!"}])
    assert status == 200, body
    assert encode_threads == [threading.get_ident()]


async def test_a_prompt_of_megabytes_leaves_the_loop_free(gateway: App) -> None:
    """While a 3 MB prompt is tokenized (seconds of work) the loop keeps turning: a 1 ms
    timer is never late by half a second, as it was when the library's encode held the GIL
    in the worker thread (the whole encode: ~1.7 s here)."""
    import asyncio
    import time

    body = {"model": gateway.model.model_id, "prompt": "hello world " * 250_000}
    worst = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - start - 0.001)

    ticking = asyncio.ensure_future(ticker())
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{gateway.http_port}/v1/completions", json=body
        ) as resp:
            status, answer = resp.status, await resp.json()
    done.set()
    await ticking
    assert (status, answer["error"]["code"]) == (400, "context_length_exceeded")
    assert worst < 0.5, f"the loop stalled for {worst * 1000:.0f} ms"
