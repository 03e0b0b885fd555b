"""Admission: when every replica is overloaded, requests wait in a bounded, fair queue.

Rule of this file: the decisions are pure (`replica_overloaded`, `all_overloaded`,
`FairQueue`); `AdmissionController` is the shell that parks requests on futures and wakes
them. A request goes straight through when nobody is waiting and some healthy replica is
below its thresholds; otherwise it joins the queue (no barging past waiters), and is woken
one at a time whenever a replica may have room (a request ended, or every `tick_s` while
anyone waits, since engine load reports arrive on their own).

A replica is never overloaded while it is idle (`homing.router.filters.idle`: nothing
running or waiting by its latest load record and none of our requests in flight), whatever
its KV usage reports, so the queue never holds a request that such a replica could start now.
Otherwise it is overloaded when the router's own engine-side rule says so
(`homing.router.filters.engine_overloaded` with its `OverloadThresholds`: a waiting queue of
`max_waiting`, or non-evictable KV usage at `max_token_usage` while the engine queues or its
admission window is full; KV usage alone is cache, not load), or
  max_running_requests > 0 and load >= max_running_requests  (the engine would queue)
  or load >= max_in_flight_per_replica      (when configured)
with `load = max(in_flight, running + waiting)` (`WorkerSnapshot.load`).

Fairness (`FairQueue`): strict priority between levels (higher `priority` first), round
robin between the tenants of one level (each turn serves the tenant served least
recently), FIFO within a tenant; the same shape as Kubernetes API Priority and Fairness.
No tenant can crowd others out: under contention (another tenant also waiting) a tenant
may hold at most `tenant_cap` waiting requests; a tenant alone may use the whole queue (the
anonymous tenant of an auth-off gateway is never capped). When the queue is full, an
arrival displaces the newest waiter of the lowest priority level below its own, or else
(its tenant under the cap) the newest same-or-lower-priority waiter of a tenant over the
cap; the displaced request gets the 503 instead. The queue timeout bounds how long a
low-priority request can be starved. Rejections are 503 `no_capacity` with `Retry-After`.

Wake-ups (`grantable`): the engine's load report does not change as requests launch, so a
replica that looks free by its last report gets one waiter per report (`load_at`), or one
more each time one of our requests on it ends; a replica without reports (its load is this
gateway's own live `in_flight`) is not limited.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import structlog

from homing.aio import cancel_and_wait
from homing.clock import Clock, SystemClock
from homing.config import AdmissionSettings
from homing.gateway.errors import APIError, no_capacity
from homing.gateway.metrics import GatewayMetrics
from homing.router.filters import OverloadThresholds, engine_overloaded, idle
from homing.router.types import WorkerSnapshot

log = structlog.get_logger("homing.admission")

Offer = Literal["queued", "queue_full", "tenant_full"]


def replica_overloaded(
    w: WorkerSnapshot, thresholds: OverloadThresholds, max_in_flight: int | None
) -> bool:
    """Whether new work sent to `w` would wait or be preempted (formula in the module doc);
    never for an idle replica."""
    if idle(w):
        return False
    if engine_overloaded(w, thresholds):
        return True
    if w.max_running_requests > 0 and w.load >= w.max_running_requests:
        return True
    return max_in_flight is not None and w.load >= max_in_flight


def all_overloaded(
    workers: Iterable[WorkerSnapshot], thresholds: OverloadThresholds, max_in_flight: int | None
) -> bool:
    """True when there is at least one worker and every one is overloaded (no healthy
    worker at all is the router's 503, not a reason to queue). Stops at the first worker
    that is not overloaded (with a lazy `workers`, no further snapshot is built)."""
    seen = False
    for w in workers:
        if not replica_overloaded(w, thresholds, max_in_flight):
            return False
        seen = True
    return seen


def grantable(
    workers: Iterable[WorkerSnapshot],
    thresholds: OverloadThresholds,
    max_in_flight: int | None,
    consumed: dict[str, tuple[float | None, int]],
) -> WorkerSnapshot | None:
    """A replica that may take one more waiter now: not overloaded, and either without load
    reports (`load_at` None), never granted to, granted to on an older report, or with
    fewer of our requests in flight than right after its last grant (one ended since, so
    room really freed). `consumed`: worker id -> (`load_at` used by its last grant,
    `in_flight` once that grant launched). None: wait for a report or a request to end."""
    for w in workers:
        if replica_overloaded(w, thresholds, max_in_flight):
            continue
        last = consumed.get(w.worker_id)
        if w.load_at is None or last is None or last[0] != w.load_at or w.in_flight < last[1]:
            return w
    return None


@dataclass(frozen=True)
class Waiter:
    """One queued request. `tenant` None: the anonymous tenant (auth off, not capped).
    `item_id` grows with arrival (larger = newer)."""

    item_id: int
    tenant: str | None
    priority: int
    request_id: str = field(default="", compare=False)


class FairQueue:
    """Bounded queue: priority levels, round robin over tenants, FIFO per tenant (pure)."""

    def __init__(self, max_queued: int, tenant_cap: int) -> None:
        self.max_queued = max_queued
        self.tenant_cap = tenant_cap
        self._levels: dict[int, OrderedDict[str | None, deque[Waiter]]] = {}
        self._by_id: dict[int, Waiter] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def queued_for(self, tenant: str | None) -> int:
        """Requests of `tenant` waiting."""
        return sum(1 for w in self._by_id.values() if w.tenant == tenant)

    def offer(self, waiter: Waiter) -> Offer:
        """`offer_displacing` without the displaced waiter."""
        return self.offer_displacing(waiter)[0]

    def offer_displacing(self, waiter: Waiter) -> tuple[Offer, Waiter | None]:
        """Queue `waiter`, or say why not: "tenant_full" (its tenant holds `tenant_cap`
        while another tenant also waits; checked first as the more specific answer) or
        "queue_full" (full, and nobody it may displace). When it took a displaced waiter's
        place, that waiter (already removed) comes second."""
        tenant = waiter.tenant
        capped = tenant is not None and self.queued_for(tenant) >= self.tenant_cap
        if capped and any(w.tenant != tenant for w in self._by_id.values()):
            return "tenant_full", None
        victim: Waiter | None = None
        if len(self._by_id) >= self.max_queued:
            victim = self._victim(waiter, capped)
            if victim is None:
                return "queue_full", None
            self.remove(victim.item_id)
        level = self._levels.setdefault(waiter.priority, OrderedDict())
        level.setdefault(waiter.tenant, deque()).append(waiter)
        self._by_id[waiter.item_id] = waiter
        return "queued", victim

    def _victim(self, arrival: Waiter, arrival_capped: bool) -> Waiter | None:
        """Whom a full queue gives up for `arrival`: the newest waiter of the lowest level
        below its priority; else, when its tenant is under the cap, the newest waiter at
        its level or lower of another tenant over the cap; else nobody."""
        if not self._by_id:
            return None
        lowest = min(self._levels)
        if lowest < arrival.priority:
            return max(
                (w for w in self._by_id.values() if w.priority == lowest),
                key=lambda w: w.item_id,
            )
        if arrival_capped:
            return None
        counts = Counter(w.tenant for w in self._by_id.values())
        over = [
            w
            for w in self._by_id.values()
            if w.priority <= arrival.priority
            and w.tenant is not None
            and w.tenant != arrival.tenant
            and counts[w.tenant] > self.tenant_cap
        ]
        return max(over, key=lambda w: w.item_id, default=None)

    def pop(self) -> Waiter | None:
        """The next request to admit: highest priority level, the tenant whose turn it is,
        that tenant's oldest request. None when empty."""
        for priority in sorted(self._levels, reverse=True):
            level = self._levels[priority]
            tenant, waiting = next(iter(level.items()))
            waiter = waiting.popleft()
            if waiting:
                level.move_to_end(tenant)
            else:
                del level[tenant]
            if not level:
                del self._levels[priority]
            del self._by_id[waiter.item_id]
            return waiter
        return None

    def remove(self, item_id: int) -> bool:
        """Take a waiting request out (timeout, client gone); False if it is not queued."""
        waiter = self._by_id.pop(item_id, None)
        if waiter is None:
            return False
        level = self._levels[waiter.priority]
        waiting = level[waiter.tenant]
        waiting.remove(waiter)
        if not waiting:
            del level[waiter.tenant]
        if not level:
            del self._levels[waiter.priority]
        return True


class AdmissionController:
    """The admission queue of one model.

    `snapshots`: the healthy replicas as the router sees them (called on every check).
    `thresholds`: the router's overload thresholds. `clock` measures and times queue waits
    and the ticker.
    """

    def __init__(
        self,
        settings: AdmissionSettings,
        *,
        model_id: str,
        snapshots: Callable[[], Iterable[WorkerSnapshot]],
        metrics: GatewayMetrics,
        thresholds: OverloadThresholds | None = None,
        clock: Clock | None = None,
        tick_s: float = 0.02,
    ) -> None:
        self.settings = settings
        self.model_id = model_id
        self.snapshots = snapshots
        self.metrics = metrics
        self.thresholds = thresholds if thresholds is not None else OverloadThresholds()
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.tick_s = tick_s
        self.queue = FairQueue(settings.max_queued, settings.tenant_cap)
        self._futures: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count()
        self._granted = False  # a woken request has not launched yet
        # worker -> (load_at, in_flight after launch) of its last grant; see `grantable`
        self._consumed: dict[str, tuple[float | None, int]] = {}
        self._ticker: asyncio.Task[None] | None = None
        # Scale to zero: with no routable replica a request waits for one (rather than the
        # router's 503), `on_hold` tells the autoscaler at once, and a wait past
        # `queue_timeout_s` is a 503 whose Retry-After is `expected_start_s()`.
        self.hold_when_empty = False
        self.on_hold: Callable[[], None] | None = None
        self.expected_start_s: Callable[[], float] | None = None

    def _empty(self) -> bool:
        return next(iter(self.snapshots()), None) is None

    @property
    def queued(self) -> int:
        """Requests waiting now."""
        return len(self.queue)

    def overloaded(self) -> bool:
        """Whether every healthy replica is overloaded now."""
        return all_overloaded(
            self.snapshots(), self.thresholds, self.settings.max_in_flight_per_replica
        )

    async def admit(self, tenant: str | None, priority: int, request_id: str) -> None:
        """Return when the request may be routed; raises `APIError` 503 (queue full, the
        tenant's share full, or `queue_timeout_s` passed)."""
        if not self.settings.enabled:
            return
        holding = self.hold_when_empty and self._empty()
        if not holding and not self.queue and not self._granted and not self.overloaded():
            return
        item_id = next(self._ids)
        offer: Offer = "queue_full"
        displaced: Waiter | None = None
        if self.settings.max_queued > 0:
            offer, displaced = self.queue.offer_displacing(
                Waiter(item_id, tenant, priority, request_id)
            )
        if offer != "queued":
            raise self._reject(offer, tenant, request_id)
        if displaced is not None:
            gone = self._futures.get(displaced.item_id)
            if gone is not None and not gone.done():
                gone.set_exception(
                    self._reject("displaced", displaced.tenant, displaced.request_id)
                )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futures[item_id] = future
        self._gauge()
        self._ensure_ticker()
        if holding and self.on_hold is not None:
            self.on_hold()
        queued_at = self.clock.now()
        try:
            async with self.clock.timeout(self.settings.queue_timeout_s):
                await future
        except TimeoutError:
            if not (future.done() and not future.cancelled()):
                self.queue.remove(item_id)
                reason = "no_replica" if self.hold_when_empty and self._empty() else "timeout"
                raise self._reject(reason, tenant, request_id) from None
            # granted just as the timeout fired: take the turn
        except BaseException:
            if (
                not self.queue.remove(item_id)
                and future.done()
                and not future.cancelled()
                and future.exception() is None
            ):
                self._granted = False  # woken but gone: pass the turn on
                self.dispatch()
            raise
        finally:
            self._futures.pop(item_id, None)
            self._gauge()
        self._granted = False
        self.metrics.admission_wait.observe(self.clock.now() - queued_at)
        # The caller routes and launches synchronously after this returns; the next waiter
        # is considered once that launch is counted.
        asyncio.get_running_loop().call_soon(self.dispatch)

    def dispatch(self) -> None:
        """Wake the next waiter if a replica has room by a report no earlier grant used
        (`grantable`) and no woken one is still launching."""
        if self._granted:
            return
        while self.queue:
            worker = grantable(
                self.snapshots(),
                self.thresholds,
                self.settings.max_in_flight_per_replica,
                self._consumed,
            )
            if worker is None:
                break
            waiter = self.queue.pop()
            if waiter is None:
                break
            future = self._futures.get(waiter.item_id)
            if future is None or future.done():
                continue
            self._consumed[worker.worker_id] = (worker.load_at, worker.in_flight + 1)
            future.set_result(None)
            self._granted = True
            break
        self._gauge()

    def reject_waiting(self, error: Callable[[], APIError]) -> None:
        """Refuse every waiting request with a fresh `error()` (the gateway shuts down)."""
        for future in list(self._futures.values()):
            if not future.done():
                future.set_exception(error())

    def _reject(self, reason: str, tenant: str | None, request_id: str) -> APIError:
        self.metrics.admission_rejected.labels(reason=reason).inc()
        busy = f"Every replica of model '{self.model_id}' is overloaded"
        retry_after = self.settings.retry_after_s
        if reason == "tenant_full":
            message = (
                f"{busy} and your requests already fill your share of the admission queue "
                f"({self.queue.tenant_cap}); retry later."
            )
        elif reason == "displaced":
            message = (
                f"{busy} and the admission queue is full; a higher-priority request took "
                "this one's place. Retry later."
            )
        elif reason == "no_replica":
            start_s = self.expected_start_s() if self.expected_start_s is not None else 0.0
            if math.isfinite(start_s):
                retry_after = max(retry_after, math.ceil(start_s))
            message = (
                f"No replica of model '{self.model_id}' is running; one is being started "
                f"(about {retry_after} s), and the request waited "
                f"{self.settings.queue_timeout_s:g} s in the admission queue. Retry later."
            )
        elif reason == "timeout":
            message = (
                f"{busy}; the request waited {self.settings.queue_timeout_s:g} s in the "
                "admission queue without a replica freeing up. Retry later."
            )
        else:
            message = f"{busy} and the admission queue is full; retry later."
        log.info("admission_rejected", request_id=request_id, tenant=tenant, reason=reason)
        return no_capacity(message, retry_after_s=retry_after)

    def _gauge(self) -> None:
        self.metrics.admission_queue_depth.labels(model=self.model_id).set(len(self.queue))

    def _ensure_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while self.queue:
            await self.clock.sleep(self.tick_s)
            self.dispatch()

    async def stop(self) -> None:
        """Stop the ticker (waiting requests time out or are cancelled with their callers)."""
        if self._ticker is not None:
            await cancel_and_wait(self._ticker)
            self._ticker = None
