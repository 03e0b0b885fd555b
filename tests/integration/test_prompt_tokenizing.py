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
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from loop_watch import Callbacks, LoopWatch, least_longest, report

from homing.app import App
from homing.config import GatewaySettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Half the most messages a chat may hold (2,048): reading and validating the body on the loop
# costs less CPU than tokenizing it, so a loop callback that held the tokenizing would be the
# longer of the two (both measured in the same run, in thread CPU time).
MESSAGES = GatewaySettings().max_messages // 2


async def _chat(app: App, messages: list[dict[str, str]]) -> tuple[int, Any]:
    body = {"model": app.model.model_id, "messages": messages, "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/chat/completions", json=body
        ) as resp:
            return resp.status, await resp.json()


@dataclass
class Encodes:
    """The served tokenizer's `encode_chat` calls: the thread each ran on and its CPU ms."""

    threads: list[int] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


@pytest.fixture
def encodes(gateway: App, monkeypatch: pytest.MonkeyPatch) -> Encodes:
    """`encode_chat` wrapped (it still runs) to record each call's thread and CPU time."""
    tokenizer = gateway.model.tokenizer
    encode_chat = tokenizer.encode_chat
    seen = Encodes()

    def recorded(*args: Any, **kwargs: Any) -> list[int]:
        seen.threads.append(threading.get_ident())
        started = time.thread_time()
        try:
            return encode_chat(*args, **kwargs)
        finally:
            seen.cpu_ms.append((time.thread_time() - started) * 1000)

    monkeypatch.setattr(tokenizer, "encode_chat", recorded)
    return seen


async def test_many_small_messages_are_tokenized_off_the_event_loop(
    gateway: App, encodes: Encodes
) -> None:
    """1,024 messages of 4 characters are encoded in a worker thread, and no loop callback
    while the request is served takes as much CPU as that encoding: one that held it would.

    Sent 3 times; compared are the least of the requests' longest callbacks and the median
    of the encodes' CPU time, as one reading of thread CPU time has a tail on a shared VM
    (see `loop_watch`).
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
    assert len(encodes.threads) == 3
    assert threading.get_ident() not in encodes.threads
    encoding = statistics.median(encodes.cpu_ms)
    assert least_longest(served) < encoding, f"encoding {encoding:.1f} ms; {report(served)}"


async def test_a_short_chat_is_tokenized_on_the_event_loop(gateway: App, encodes: Encodes) -> None:
    """A one-message chat is encoded inline: a thread hop would cost it more than encoding."""
    status, body = await _chat(gateway, [{"role": "user", "content": "Hello!"}])
    assert status == 200, body
    assert encodes.threads == [threading.get_ident()]


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
