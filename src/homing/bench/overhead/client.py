"""One request of `make bench-overhead` to one target: an OpenAI chat completion over HTTP
(homing, smg and the other gateways), homing's gRPC API, or a Generate straight to a worker
(DIRECT, the first-byte baseline); the time to its first byte and whether the answer was good.

Rule of this file: one request at a time and its verdict; how many, how fast and what is
measured around them is `phases`.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import aiohttp
import grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl

from homing.bench.overhead.stack import Stack
from homing.bench.overhead.targets import DIRECT, HOMING_GRPC
from homing.bench.overhead.workload import (
    PROMPT_TEXT,
    REQUEST_TIMEOUT_S,
    chat_body,
    check_usage,
)
from homing.bench.sse import SseDecoder
from homing.v1 import inference_pb2 as api

USAGE_OBJECT = re.compile(r'"usage":\s*\{')
"""An SSE chunk carrying a usage object (not `"usage": null`)."""


class Client:
    """One request of each kind to each target; each returns (seconds from send to first
    byte, None) for a good answer or (seconds, error text) otherwise."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self._next_worker = 0
        self._rid = 0

    async def request(self, target: str, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        """One request to `target` (HOMING, SMG, HOMING_GRPC or DIRECT)."""
        try:
            if target == DIRECT:
                return await self._direct(max_tokens, stream)
            if target == HOMING_GRPC:
                return await self._api(max_tokens, stream)
            return await self._http(target, max_tokens, stream)
        except (aiohttp.ClientError, grpc.aio.AioRpcError, TimeoutError, ValueError) as exc:
            return 0.0, f"{type(exc).__name__}: {str(exc)[:200]}"

    async def _http(self, target: str, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        session = self.stack.session
        assert session is not None
        url = self.stack.http_urls[target] + "/v1/chat/completions"
        body = json.dumps(chat_body(self.stack.model, max_tokens, stream)).encode()
        headers = {"Content-Type": "application/json"}
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as resp:
            if not stream:
                data = await resp.read()
                first = time.perf_counter() - started
                if resp.status != 200:
                    return first, f"HTTP {resp.status}: {data[:200]!r}"
                usage = json.loads(data).get("usage") or {}
                return first, check_usage(usage.get("completion_tokens"), max_tokens)
            if resp.status != 200:
                return time.perf_counter() - started, f"HTTP {resp.status}"
            decoder = SseDecoder()
            first_s: float | None = None
            usage: dict[str, Any] = {}
            done = False
            async for piece in resp.content.iter_any():
                for event in decoder.feed(piece):
                    if event == "[DONE]":
                        done = True
                        continue
                    if first_s is not None and not USAGE_OBJECT.search(event):
                        continue  # text after the first: not parsed (client work kept small)
                    chunk = json.loads(event)
                    if first_s is None and any(
                        (choice.get("delta") or {}).get("content")
                        for choice in chunk.get("choices") or ()
                    ):
                        first_s = time.perf_counter() - started
                    usage = chunk.get("usage") or usage
        if first_s is None:
            return 0.0, "no event carried text"
        if not done:
            return first_s, "no data: [DONE]"
        return first_s, check_usage(usage.get("completion_tokens"), max_tokens)

    async def _api(self, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        stub = self.stack.api_stub
        assert stub is not None
        request = api.ChatCompletionRequest(
            model=self.stack.model,
            messages=[api.ChatMessage(role="user", content=PROMPT_TEXT)],
            sampling=api.SamplingOptions(max_tokens=max_tokens, temperature=0, ignore_eos=True),
            stream=stream,
        )
        started = time.perf_counter()
        first_s: float | None = None
        completion: int | None = None
        async for message in stub.ChatCompletion(request, timeout=REQUEST_TIMEOUT_S):
            if first_s is None and (not stream or any(c.text for c in message.choices)):
                first_s = time.perf_counter() - started
            if message.HasField("usage"):
                completion = message.usage.completion_tokens
        if first_s is None:
            return 0.0, "no message carried text"
        return first_s, check_usage(completion, max_tokens)

    async def _direct(self, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        stubs = self.stack.worker_stubs
        stub = stubs[self._next_worker % len(stubs)]
        self._next_worker += 1
        self._rid += 1
        request = sgl.GenerateRequest(
            request_id=f"bench-overhead-{os.getpid()}-{self._rid}",
            tokenized=sgl.TokenizedInput(input_ids=self.stack.prompt_ids),
            sampling_params=sgl.SamplingParams(
                temperature=0.0, max_new_tokens=max_tokens, ignore_eos=True
            ),
            stream=stream,
        )
        started = time.perf_counter()
        first_s: float | None = None
        completion: int | None = None
        async for message in stub.Generate(request, timeout=REQUEST_TIMEOUT_S):
            kind = message.WhichOneof("response")
            if first_s is None and (
                kind == "complete" or (kind == "chunk" and message.chunk.token_ids)
            ):
                first_s = time.perf_counter() - started
            if kind == "complete":
                completion = message.complete.completion_tokens
        if first_s is None:
            return 0.0, "no message carried a token"
        return first_s, check_usage(completion, max_tokens)
