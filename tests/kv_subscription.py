"""One `SubscribeKvEvents` call of an SGLang-protocol worker (real or simulated), read into a
list in the background, for tests that assert on the batches a worker publishes.

Subscribed as homing's client does: from sequence 0, with load records before the first batch
unless the caller asks otherwise. `until` waits on a condition notified at each batch, not on
a polling sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import grpc.aio
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

Batches = list[common_pb2.KvEventBatch]


class KvSubscription:
    """A `SubscribeKvEvents` call whose batches collect in `batches`, in arrival order.

    `open()` starts reading and returns once the worker has sent the call's headers (both
    homing's simulator and SGLang send them after joining their event source, so no event
    published after that is missed). `error` is the gRPC error that ended the stream, if one
    did before `close()`.
    """

    def __init__(
        self,
        stub: pb_grpc.SglangSchedulerStub,
        *,
        load_records_before_first_batch: bool = True,
    ) -> None:
        self.batches: Batches = []
        self.error: grpc.aio.AioRpcError | None = None
        self._call: grpc.aio.UnaryStreamCall = stub.SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(
                start_sequence_number=0,
                load_records_before_first_batch=load_records_before_first_batch,
            )
        )
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._ended = False
        self._closing = False

    async def open(self, within_s: float = 10.0) -> KvSubscription:
        """Start reading and wait for the call's headers; AssertionError past `within_s`."""
        if self._task is None:
            self._task = asyncio.create_task(self._read())
        try:
            await asyncio.wait_for(self._call.initial_metadata(), within_s)
        except TimeoutError:
            raise AssertionError(f"SubscribeKvEvents: no headers within {within_s} s") from None
        return self

    async def _read(self) -> None:
        try:
            async for batch in self._call:
                self.batches.append(batch)
                await self._notify()
        except grpc.aio.AioRpcError as err:
            if not self._closing:
                self.error = err
        finally:
            self._ended = True
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def until(
        self,
        predicate: Callable[[Batches], object],
        what: str = "the condition",
        within_s: float = 10.0,
    ) -> None:
        """Return once `predicate(batches)` is true (checked now and at each new batch).

        AssertionError naming `what` if `within_s` passes first, or if the stream ends first.
        """
        if self._task is None:
            raise RuntimeError("KvSubscription.until before open()")
        met = False

        def settled() -> bool:
            nonlocal met
            met = bool(predicate(self.batches))
            return met or self._ended

        try:
            async with asyncio.timeout(within_s), self._changed:
                await self._changed.wait_for(settled)
        except TimeoutError:
            raise AssertionError(
                f"{what}: not within {within_s} s; got {len(self.batches)} batches"
            ) from None
        if not met:
            raise AssertionError(
                f"{what}: the stream ended first ({self.error!r}); got {len(self.batches)} batches"
            )

    def event_batches(self) -> Batches:
        """The batches that carry events (all but the load_only records)."""
        return [b for b in self.batches if not b.load.load_only]

    async def close(self) -> None:
        """Cancel the call and wait for the reader; `batches` stay for assertions."""
        self._closing = True
        self._call.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
