"""The inputs of `homing.bench.affinity` from a live run: every worker's KV events, and what
each request's router decided.

Rule of this file: the I/O edge of the affinity judge. `KvTrace` subscribes to each worker's
`SubscribeKvEvents` stream for the length of a run and keeps the batches' bytes (decoded after
the run, so the client pays only the receive while it replays); `homing_routes` reads the
`route` object of homing's `request_done` log lines; `routed_requests` joins them with the
client's records.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from smg_grpc_proto.generated import common_pb2

from homing.bench.affinity import CLEARED, REMOVED, STORED, CacheChange, Routed
from homing.bench.records import RequestRecord
from homing.engines.client import EngineClient, EngineError
from homing.router.events import BlocksRemoved, BlocksStored, CacheCleared, events_from_batch
from homing.sim.radix_cache import block_hash_chain


class KvTrace:
    """KV-event batches of the workers at `urls` (by worker id), from `start` to `stop`."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self._urls = dict(urls)
        self._batches: list[tuple[str, bytes]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._clients: list[EngineClient] = []
        self.errors: list[str] = []
        self.gaps: dict[str, int] = {}

    async def start(self, timeout_s: float = 30.0) -> None:
        """Subscribe to every worker and wait until each stream delivered its first record
        (the load record a subscriber asks for at once): events published from then on are
        seen. TimeoutError past `timeout_s`."""
        live = []
        for worker_id, url in self._urls.items():
            client = EngineClient(url, worker_id=worker_id)
            self._clients.append(client)
            first = asyncio.Event()
            live.append(first)
            self._tasks.append(asyncio.create_task(self._follow(worker_id, client, first)))
        async with asyncio.timeout(timeout_s):
            for first in live:
                await first.wait()

    async def _follow(self, worker_id: str, client: EngineClient, first: asyncio.Event) -> None:
        try:
            async for data in client.subscribe_kv_events():
                first.set()
                self._batches.append((worker_id, data))
        except EngineError as err:
            self.errors.append(f"{worker_id}: {err}")

    async def stop(self) -> list[CacheChange]:
        """End the subscriptions; every event received, as `CacheChange`s stamped with their
        batch's timestamp (the engine's publish time). `errors` then names each stream that
        failed, and `gaps` the batches missed per worker: either makes the judge's caches
        incomplete for that worker."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for client in self._clients:
            await client.close()
        return list(changes_from_batches(self._batches, self.gaps))


def changes_from_batches(
    batches: Iterable[tuple[str, bytes]], gaps: dict[str, int] | None = None
) -> Iterable[CacheChange]:
    """Each `(worker id, KvEventBatch bytes)`'s events as `CacheChange`s. `gaps`, when
    given, counts per worker the event batches missing between consecutive ones received
    (sequence numbers), after which its rebuilt cache is incomplete."""
    last: dict[str, int] = {}
    for worker_id, data in batches:
        batch = common_pb2.KvEventBatch.FromString(data)
        if not batch.events:
            continue  # a load record (it repeats the last sequence number)
        seq = batch.sequence_number
        before = last.get(worker_id)
        if gaps is not None and before is not None and seq > before + 1:
            gaps[worker_id] = gaps.get(worker_id, 0) + seq - before - 1
        last[worker_id] = seq
        at = batch.timestamp
        for event in events_from_batch(batch):
            if isinstance(event, BlocksStored):
                hashes = tuple(b.engine_hash for b in event.blocks)
                yield CacheChange(at, worker_id, STORED, hashes)
            elif isinstance(event, BlocksRemoved):
                yield CacheChange(at, worker_id, REMOVED, tuple(event.engine_hashes))
            elif isinstance(event, CacheCleared):
                yield CacheChange(at, worker_id, CLEARED)


def homing_routes(log_lines: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The `route` object of each `request_done` line of a homing log, by request id (lines
    that are not JSON objects are skipped)."""
    routes: dict[str, dict[str, Any]] = {}
    for line in log_lines:
        if '"request_done"' not in line:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        route = doc.get("route")
        if route is not None:
            routes[doc["request_id"]] = route
    return routes


def routed_requests(
    records: Sequence[RequestRecord],
    prompts: Mapping[int, Sequence[int]],
    *,
    sent_at: float,
    block_size: int,
    routes: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Routed]:
    """One `Routed` per answered record (a worker and a cached-token count): its prompt
    (`prompts` by trace index), its decision time (the route's `at`, else `sent_at` plus the
    record's send time: the client's, a little before the router's decision) and, with
    `routes` (by `request_id(index)`), the index's view where the policy consulted it and the
    decision's worker served the request."""
    out = []
    for rec in records:
        if rec.worker is None or rec.cached_tokens is None:
            continue
        prompt = prompts[rec.index]
        rid = request_id(rec.index)
        route = routes.get(rid) if routes is not None else None
        at = float(route["at"]) if route is not None else sent_at + (rec.send_s or 0.0)
        if route is not None and (
            route.get("best_tokens") is None or route.get("worker", rec.worker) != rec.worker
        ):
            # a policy that does not consult the index, or a first decision whose worker did
            # not serve the request (retried elsewhere): its index view says nothing here
            route = None
        out.append(
            Routed(
                request_id=rid,
                at=at,
                prompt_len=len(prompt),
                chain=tuple(block_hash_chain(prompt, block_size)),
                worker=rec.worker,
                served=rec.cached_tokens,
                index_branch=route["branch"] if route is not None else None,
                index_matched=route["matched_tokens"] if route is not None else None,
                index_best=route["best_tokens"] if route is not None else None,
                index_best_worker=route["best_worker"] if route is not None else None,
            )
        )
    return out


def request_id(index: int) -> str:
    """The `x-request-id` the bench sends for trace request `index`."""
    return f"bench-{index}"
