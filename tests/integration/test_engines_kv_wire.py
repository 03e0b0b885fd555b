"""The pool's KV subscription hands the router the bytes gRPC delivered: a servicer on
loopback that streams raw bytes (good batches, then junk) drives a real pool and router."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest_asyncio
from helpers import eventually
from smg_grpc_proto.generated import common_pb2

from homing.engines.client import EngineClient
from homing.engines.pool import PoolConfig, WorkerPool
from homing.router import Router
from homing.router.events import BatchCounts
from homing.router.testing import RecordingObserver

FAST = PoolConfig(
    health_interval_s=0.05, health_timeout_s=0.5, kv_backoff_initial_s=0.05, kv_backoff_max_s=0.2
)
JUNK = b"\x1a\x05ab"  # an events field whose length runs past the end


def tokens(subscription: int) -> list[int]:
    """The 16 tokens stored on the `subscription`-th subscription (1-based)."""
    return list(range(1000 * subscription, 1000 * subscription + 16))


def stored(seq: int, subscription: int) -> bytes:
    batch = common_pb2.KvEventBatch(sequence_number=seq, timestamp=1.0)
    batch.load.running_requests = subscription
    ev = batch.events.add(event_id=seq)
    ev.stored.blocks.add(block_hash=subscription, token_ids=tokens(subscription))
    return batch.SerializeToString()


class RawKvServicer:
    """SubscribeKvEvents only (every other method is UNIMPLEMENTED), written as raw bytes:
    each subscription streams one stored batch; the first then sends `JUNK`; later ones
    stay open until cancelled."""

    def __init__(self) -> None:
        self.subscriptions = 0
        self.cancelled = 0

    async def subscribe(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self.subscriptions += 1
        n = self.subscriptions
        try:
            yield stored(1, n)
            if n == 1:
                yield JUNK
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "sglang.grpc.scheduler.SglangScheduler",
            {
                "SubscribeKvEvents": grpc.unary_stream_rpc_method_handler(
                    self.subscribe,
                    request_deserializer=common_pb2.SubscribeKvEventsRequest.FromString,
                    response_serializer=None,
                )
            },
        )


@pytest_asyncio.fixture
async def servicer() -> AsyncIterator[tuple[RawKvServicer, str]]:
    """The servicer on a free loopback port, and its URL."""
    raw = RawKvServicer()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((raw.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield raw, f"grpc://127.0.0.1:{port}"
    finally:
        await server.stop(0.1)


async def test_subscription_yields_the_bytes_on_the_wire(
    servicer: tuple[RawKvServicer, str],
) -> None:
    """`subscribe_kv_events` yields each batch as the bytes the servicer wrote."""
    _, url = servicer
    client = EngineClient(url, worker_id="w0")
    try:
        stream = client.subscribe_kv_events()
        first = await anext(stream)
        second = await anext(stream)
        await stream.aclose()
    finally:
        await client.close()
    assert (first, second) == (stored(1, 1), JUNK)


async def test_malformed_bytes_end_the_stream_and_the_pool_resubscribes(
    servicer: tuple[RawKvServicer, str],
) -> None:
    """Junk on the stream: the subscription is cancelled, the worker flushed as a stream
    error and subscribed to again; the new subscription's batch is applied."""
    raw, url = servicer
    recorder = RecordingObserver()
    router = Router(observer=recorder)
    pool = WorkerPool([url], router=router, config=FAST)
    await pool.start()
    try:
        assert await eventually(lambda: router.index.match(tokens(2)) == {"w0": 16}, 5)
        assert await eventually(lambda: raw.cancelled >= 1, 5)
        state = pool.state("w0")
        assert state.kv_stream == "open"
        assert state.load is not None and state.load.running == 2
    finally:
        await pool.stop()
    assert raw.subscriptions == 2
    assert router.index.match(tokens(1)) == {}  # flushed with the failed stream
    reasons = ["subscribe", "exact_mode", "stream_error", "subscribe", "exact_mode"]
    assert recorder.flush_reasons() == reasons
    assert recorder.batch_counts() == [BatchCounts(stored=1), BatchCounts(stored=1)]
