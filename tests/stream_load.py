"""A steady streaming load on a gateway: `concurrency` OpenAI-style clients, each sending
streamed completions back to back over its own aiohttp session until stopped."""

from __future__ import annotations

import asyncio
import collections
import itertools
from types import TracebackType

import aiohttp


class StreamLoad:
    """`async with StreamLoad(port, model=...) as load:` runs the clients; on exit they stop
    (each finishes or abandons its request). `ok`: completed streams ending with `[DONE]`
    and no error event; `failed`: what went wrong otherwise (status or error text);
    `by_worker`: completed streams per `x-homing-worker`."""

    def __init__(
        self, port: int, *, model: str, concurrency: int = 6, max_tokens: int = 64
    ) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.model = model
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.ok = 0
        self.failed: list[str] = []
        self.by_worker: collections.Counter[str] = collections.Counter()
        self._ids = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    async def __aenter__(self) -> StreamLoad:
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.concurrency)]
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop the clients: each ends after its current request (at most 10 s), then is
        cancelled."""
        self._stopping = True
        done, pending = await asyncio.wait(self._tasks, timeout=10.0) if self._tasks else ((), ())
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        self._tasks = []

    async def _client(self, index: int) -> None:
        async with aiohttp.ClientSession() as http:
            while not self._stopping:
                n = next(self._ids)
                body = {
                    "model": self.model,
                    "prompt": f"client {index} request {n}: tell me a story",
                    "max_tokens": self.max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
                try:
                    async with http.post(self.url, json=body) as resp:
                        text = (await resp.read()).decode()
                        worker = resp.headers.get("x-homing-worker", "")
                        if resp.status != 200:
                            self.failed.append(f"{resp.status}: {text[:200]}")
                        elif '"error"' in text or not text.rstrip().endswith("data: [DONE]"):
                            self.failed.append(f"stream: {text[-200:]}")
                        else:
                            self.ok += 1
                            self.by_worker[worker] += 1
                except aiohttp.ClientError as err:
                    self.failed.append(f"client: {err!r}")
