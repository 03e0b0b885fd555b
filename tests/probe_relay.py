"""A gRPC relay in front of one worker that can hold its HealthCheck calls: the worker's
probe stalls (as SGLang's, a one-token generation queued behind a full batch, does under
load) while every other call, Generate and SubscribeKvEvents included, passes through.

Calls are relayed as bytes (no deserialization), each method by its kind from the
scheduler service's descriptor; a worker's error status is passed on as it came.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["SglangScheduler"]


class ProbeRelay:
    """Relay on a free loopback port to `worker_url` (grpc://host:port). Between `hold()`
    and `release()`, HealthCheck calls wait (until the caller's deadline) instead of
    reaching the worker. `held`: HealthCheck calls held so far."""

    def __init__(self, worker_url: str) -> None:
        self.target = worker_url.removeprefix("grpc://")
        self._passing = asyncio.Event()
        self._passing.set()
        self.held = 0
        self.url = ""
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> str:
        """Serve; returns the relay's grpc:// URL."""
        self._channel = grpc.aio.insecure_channel(self.target)
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in _SERVICE.methods:
            path = f"/{_SERVICE.full_name}/{method.name}"
            if method.server_streaming:
                handlers[method.name] = grpc.unary_stream_rpc_method_handler(self._stream(path))
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(self._unary(path))
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),)
        )
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.url = f"grpc://127.0.0.1:{port}"
        return self.url

    def hold(self) -> None:
        """Hold HealthCheck calls from now on."""
        self._passing.clear()

    def release(self) -> None:
        """Let HealthCheck calls through again (held ones included)."""
        self._passing.set()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.1)
        if self._channel is not None:
            await self._channel.close()

    def _unary(self, path: str) -> Callable[[bytes, Any], Awaitable[bytes]]:
        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            assert self._channel is not None
            if path.endswith("/HealthCheck") and not self._passing.is_set():
                self.held += 1
                await self._passing.wait()
            call = self._channel.unary_unary(path)
            try:
                return await call(request, timeout=context.time_remaining())
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "")
                raise  # abort raises; this line is not reached

        return relay

    def _stream(self, path: str) -> Callable[[bytes, Any], AsyncIterator[bytes]]:
        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            assert self._channel is not None
            call = self._channel.unary_stream(path)(request, timeout=context.time_remaining())
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "")
            finally:
                call.cancel()

        return relay
