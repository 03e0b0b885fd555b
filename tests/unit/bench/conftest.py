"""A minimal stand-in for the gateway's `/v1/completions` streaming contract, on loopback.

It is a test double, not a gateway: it checks the request body against the contract the bench
relies on (issue 2, part C), streams one text chunk per token as OpenAI does, then a usage chunk
(`prompt_tokens_details.cached_tokens` = longest prefix shared with an earlier prompt, whole
16-token pages) and `data: [DONE]`, and names a worker in `x-homing-worker` (round robin).
`faults` (keyed by prompt length) make single requests misbehave: `"400"`, `"no_done"`,
`"no_usage"`, `"drop"` (connection cut mid-stream), `"slow"` (never finishes in time).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web

PAGE = 16


class FakeGateway:
    """Streams `max_tokens` chunks of text "t " per request, `token_delay_s` apart."""

    def __init__(
        self,
        *,
        model: str = "fake-model",
        token_delay_s: float = 0.002,
        faults: dict[int, str] | None = None,
        workers: tuple[str, ...] = ("w0", "w1"),
    ) -> None:
        self.model = model
        self.token_delay_s = token_delay_s
        self.faults = faults or {}
        self.workers = workers
        self.bodies: list[dict[str, Any]] = []
        self.worker_by_prompt_len: dict[int, str] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.received = asyncio.Event()  # set when the first request body arrives
        self._seen: list[list[int]] = []
        self._next = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    def _cached(self, prompt: list[int]) -> int:
        best = 0
        for old in self._seen:
            n = 0
            for a, b in zip(old, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._seen.append(prompt)
        return best // PAGE * PAGE

    @staticmethod
    def _error(status: int, message: str, worker: str | None = None) -> web.Response:
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None}}
        headers = {"x-homing-worker": worker} if worker else None
        return web.json_response(body, status=status, headers=headers)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.received.set()
        prompt = body.get("prompt")
        contract_ok = (
            body.get("model") == self.model
            and isinstance(prompt, list)
            and all(isinstance(t, int) for t in prompt)
            and isinstance(body.get("max_tokens"), int)
            and body.get("ignore_eos") is True
            and body.get("stream") is True
            and body.get("stream_options") == {"include_usage": True}
            and body.get("temperature") == 0
        )
        if not contract_ok:
            return self._error(400, "request does not follow the bench contract")
        assert isinstance(prompt, list)
        fault = self.faults.get(len(prompt))
        worker = self.workers[self._next % len(self.workers)]
        self._next += 1
        self.worker_by_prompt_len[len(prompt)] = worker
        if fault == "400":
            return self._error(400, "max_tokens is too large", worker)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, prompt, worker, fault)
        finally:
            self.in_flight -= 1

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        prompt: list[int],
        worker: str,
        fault: str | None,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"content-type": "text/event-stream", "x-homing-worker": worker}
        )
        await resp.prepare(request)
        cached = self._cached(prompt)
        n = body["max_tokens"]

        async def send(obj: object) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            await resp.write(f"data: {data}\n\n".encode())

        if fault == "slow":
            await asyncio.sleep(30)
        for i in range(n):
            await asyncio.sleep(self.token_delay_s)
            if fault == "drop" and i == n // 2:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            finish = "length" if i == n - 1 else None
            await send(
                {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "model": self.model,
                    "choices": [{"index": 0, "text": "t ", "finish_reason": finish}],
                    "usage": None,
                }
            )
        if fault != "no_usage":
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": n,
                "total_tokens": len(prompt) + n,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            await send({"id": "cmpl-fake", "choices": [], "usage": usage})
        if fault != "no_done":
            await send("[DONE]")
        await resp.write_eof()
        return resp


async def _start(gateway: FakeGateway) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(gateway.app(), handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def gateway_factory() -> AsyncIterator[Any]:
    """Async factory: `await gateway_factory(**FakeGateway kwargs)` -> (gateway, base url)."""
    runners: list[web.AppRunner] = []

    async def make(**kwargs: Any) -> tuple[FakeGateway, str]:
        gateway = FakeGateway(**kwargs)
        runner, url = await _start(gateway)
        runners.append(runner)
        return gateway, url

    yield make
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def fake_gateway(gateway_factory: Any) -> tuple[FakeGateway, str]:
    """A running FakeGateway with no faults and its base URL."""
    return await gateway_factory()


@pytest.fixture
def threaded_gateway() -> Iterator[tuple[FakeGateway, str]]:
    """A FakeGateway served from its own thread and loop, for tests of the sync CLI entry."""
    gateway = FakeGateway()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(_start(gateway))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield gateway, box["url"]
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
