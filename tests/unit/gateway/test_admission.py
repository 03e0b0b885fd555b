"""Admission: overload is decided from replica snapshots; the queue is bounded, fair across
tenants by round robin, ordered by priority, and its waits end in admission or a 503."""

from __future__ import annotations

import asyncio

import pytest

from homing.clock import ManualClock
from homing.config import AdmissionSettings
from homing.gateway.admission import (
    AdmissionController,
    FairQueue,
    Waiter,
    all_overloaded,
    grantable,
    replica_overloaded,
)
from homing.gateway.errors import APIError
from homing.gateway.metrics import GatewayMetrics
from homing.router.filters import OverloadThresholds
from homing.router.types import WorkerSnapshot

T = OverloadThresholds()


class TestOverload:
    def test_kv_pool_nearly_full_and_queueing_is_overloaded(self) -> None:
        """KV utilisation at the router's `max_token_usage` while the engine queues makes a
        replica overloaded."""
        assert replica_overloaded(
            WorkerSnapshot("w", running=4, waiting=1, token_usage=0.95), T, None
        )
        assert not replica_overloaded(
            WorkerSnapshot("w", running=4, waiting=1, token_usage=0.94), T, None
        )

    def test_full_kv_with_no_queue_and_free_slots_is_not_overloaded(self) -> None:
        """KV usage is a stock, not a rate: 0.99 with nothing waiting and free running slots
        (or an unknown window) admits more."""
        for window in (0, 64):
            w = WorkerSnapshot(
                "w", in_flight=3, running=3, token_usage=0.99, max_running_requests=window
            )
            assert not replica_overloaded(w, T, None)

    def test_full_kv_at_a_full_admission_window_is_overloaded(self) -> None:
        """High KV usage with every running slot taken: the engine would queue."""
        w = WorkerSnapshot("w", in_flight=8, running=8, token_usage=0.99, max_running_requests=8)
        assert replica_overloaded(w, T, None)

    def test_usage_held_by_evictable_cache_is_not_overloaded(self) -> None:
        """An engine reporting `active_token_usage` (non-evictable) below the threshold is
        judged by it, even with a nearly full `token_usage` and a short queue."""
        w = WorkerSnapshot(
            "w", in_flight=4, running=4, waiting=2, token_usage=0.99, active_token_usage=0.2
        )
        assert not replica_overloaded(w, T, None)
        pinned = WorkerSnapshot(
            "w", in_flight=4, running=4, waiting=2, token_usage=0.99, active_token_usage=0.97
        )
        assert replica_overloaded(pinned, T, None)

    def test_an_idle_replica_is_never_overloaded(self) -> None:
        """Nothing running, nothing waiting and nothing of ours in flight: admitted whatever
        its KV usage or admission window say; a waiting queue alone makes it not idle."""
        idle = WorkerSnapshot(
            "w", token_usage=0.99, active_token_usage=0.99, max_running_requests=8
        )
        assert not replica_overloaded(idle, T, 1)
        queued = WorkerSnapshot("w", waiting=40, token_usage=0.99, max_running_requests=8)
        assert replica_overloaded(queued, T, 1)
        assert not all_overloaded([WorkerSnapshot("a", in_flight=3), idle], T, 3)
        assert grantable([idle], T, None, {"w": (idle.load_at, 1)}) is idle

    def test_full_engine_admission_window_is_overloaded(self) -> None:
        """A replica whose load reaches its `max_running_requests` would queue new work."""
        full = WorkerSnapshot("w", running=6, waiting=2, max_running_requests=8)
        assert replica_overloaded(full, T, None)
        assert not replica_overloaded(
            WorkerSnapshot("w", running=7, max_running_requests=8), T, None
        )

    def test_configured_in_flight_cap_counts_our_own_requests(self) -> None:
        """`max_in_flight_per_replica` caps this gateway's in-flight requests per replica."""
        assert replica_overloaded(WorkerSnapshot("w", in_flight=2), T, 2)
        assert not replica_overloaded(WorkerSnapshot("w", in_flight=1), T, 2)

    def test_queue_only_when_every_replica_is_overloaded(self) -> None:
        """One replica with room is enough to admit; no replica at all is not a queue case."""
        busy = WorkerSnapshot("a", in_flight=3)
        idle = WorkerSnapshot("b", in_flight=0)
        assert all_overloaded([busy, busy], T, 3)
        assert not all_overloaded([busy, idle], T, 3)
        assert not all_overloaded([], T, 3)


class TestFairQueue:
    def test_tenants_take_turns_regardless_of_arrival_order(self) -> None:
        """A tenant that queued five requests first does not make a later tenant wait for
        all five: tenants alternate, FIFO within each."""
        q = FairQueue(max_queued=10, tenant_cap=5)
        for i in range(5):
            assert q.offer(Waiter(i, "a", 0)) == "queued"
        assert q.offer(Waiter(10, "b", 0)) == "queued"
        assert q.offer(Waiter(11, "b", 0)) == "queued"
        order = []
        while (w := q.pop()) is not None:
            order.append(w.item_id)
        assert order == [0, 10, 1, 11, 2, 3, 4]

    def test_higher_priority_is_served_first(self) -> None:
        """A priority-5 tenant arriving last is admitted before priority-0 waiters."""
        q = FairQueue(max_queued=10, tenant_cap=5)
        q.offer(Waiter(1, "a", 0))
        q.offer(Waiter(2, "b", 0))
        q.offer(Waiter(3, "vip", 5))
        assert [q.pop(), q.pop(), q.pop()] == [
            Waiter(3, "vip", 5),
            Waiter(1, "a", 0),
            Waiter(2, "b", 0),
        ]

    def test_no_tenant_can_fill_the_queue_under_contention(self) -> None:
        """Past its cap a tenant is refused while another tenant waits and others still
        find room."""
        q = FairQueue(max_queued=4, tenant_cap=2)
        assert q.offer(Waiter(0, "b", 0)) == "queued"
        assert [q.offer(Waiter(i, "a", 0)) for i in range(1, 4)] == [
            "queued",
            "queued",
            "tenant_full",
        ]
        assert q.offer(Waiter(6, "c", 0)) == "queued"
        assert q.offer(Waiter(7, "d", 0)) == "queue_full"

    def test_a_tenant_alone_may_use_the_whole_queue(self) -> None:
        """Without contention the cap does not apply; a later tenant under its cap then
        displaces the over-cap tenant's newest waiter."""
        q = FairQueue(max_queued=4, tenant_cap=1)
        assert [q.offer(Waiter(i, "a", 0)) for i in range(4)] == ["queued"] * 4
        assert q.offer_displacing(Waiter(9, "b", 0)) == ("queued", Waiter(3, "a", 0))
        assert q.offer(Waiter(10, "a", 0)) == "tenant_full"

    def test_full_queue_gives_a_higher_priority_arrival_the_newest_lowest_waiter_place(
        self,
    ) -> None:
        """A full queue displaces the newest waiter of the lowest level below the arrival's
        priority; an arrival of that lowest level is refused."""
        q = FairQueue(max_queued=3, tenant_cap=3)
        for i, priority in enumerate((0, 0, 2)):
            assert q.offer(Waiter(i, None, priority)) == "queued"
        assert q.offer_displacing(Waiter(5, None, 1)) == ("queued", Waiter(1, None, 0))
        assert q.offer_displacing(Waiter(6, None, 0)) == ("queue_full", None)
        assert [q.pop(), q.pop(), q.pop(), q.pop()] == [
            Waiter(2, None, 2),
            Waiter(5, None, 1),
            Waiter(0, None, 0),
            None,
        ]

    def test_anonymous_requests_are_bounded_only_by_the_queue(self) -> None:
        """With auth off (tenant None) the per-tenant cap does not apply."""
        q = FairQueue(max_queued=3, tenant_cap=1)
        assert [q.offer(Waiter(i, None, 0)) for i in range(4)] == [
            "queued",
            "queued",
            "queued",
            "queue_full",
        ]

    def test_removed_waiter_is_never_popped(self) -> None:
        """A request that timed out or disconnected leaves no trace in the order."""
        q = FairQueue(max_queued=4, tenant_cap=4)
        for i in range(3):
            q.offer(Waiter(i, "a", 0))
        assert q.remove(1)
        assert not q.remove(1)
        assert [q.pop(), q.pop(), q.pop()] == [Waiter(0, "a", 0), Waiter(2, "a", 0), None]
        assert len(q) == 0


class Fleet:
    """Replica snapshots the controller reads; a test changes them to free capacity."""

    def __init__(self, in_flight: int) -> None:
        self.in_flight = in_flight

    def snapshots(self) -> list[WorkerSnapshot]:
        return [WorkerSnapshot("w0", in_flight=self.in_flight)]


def controller(
    fleet: Fleet, clock: ManualClock | None = None, **settings: object
) -> AdmissionController:
    """A controller over `fleet` whose waits (queue timeout, ticker) run on `clock`."""
    values: dict[str, object] = {"max_in_flight_per_replica": 1, "queue_timeout_s": 5.0}
    values.update(settings)
    return AdmissionController(
        AdmissionSettings.model_validate(values),
        model_id="m",
        snapshots=fleet.snapshots,
        metrics=GatewayMetrics(),
        tick_s=0.005,
        clock=clock if clock is not None else ManualClock(),
    )


class TestController:
    async def test_requests_pass_straight_through_while_a_replica_has_room(self) -> None:
        """Nobody waits and the replica is below its cap: admit returns at once."""
        fleet = Fleet(in_flight=0)
        c = controller(fleet)
        await asyncio.wait_for(c.admit("a", 0, "r1"), 0.1)
        assert len(c.queue) == 0
        await c.stop()

    async def test_waiter_is_admitted_when_capacity_frees(self) -> None:
        """A queued request proceeds once the replica's load drops below its threshold."""
        fleet = Fleet(in_flight=1)
        clock = ManualClock()
        c = controller(fleet, clock)
        waiting = asyncio.get_running_loop().create_task(c.admit("a", 0, "r1"))
        await clock.settle()
        clock.advance(1.0)  # the ticker runs, the replica is still full
        await clock.settle()
        assert not waiting.done() and len(c.queue) == 1
        assert c.metrics.value("homing_admission_queue_depth", model="m") == 1
        fleet.in_flight = 0
        c.dispatch()
        await asyncio.wait_for(waiting, 0.5)
        assert len(c.queue) == 0
        await c.stop()

    async def test_wait_past_the_timeout_is_503_with_retry_after(self) -> None:
        """A request still queued at `queue_timeout_s` gets 503 `no_capacity`."""
        clock = ManualClock()
        c = controller(Fleet(in_flight=1), clock, queue_timeout_s=0.05, retry_after_s=2)
        waiting = asyncio.get_running_loop().create_task(c.admit("a", 0, "r1"))
        await clock.settle()
        clock.advance(0.049)
        await clock.settle()
        assert not waiting.done()
        clock.advance(0.001)
        with pytest.raises(APIError) as caught:
            await waiting
        assert (caught.value.status, caught.value.retry_after_s) == (503, 2)
        assert caught.value.body() == {
            "error": {
                "message": "Every replica of model 'm' is overloaded; the request waited 0.05 s "
                "in the admission queue without a replica freeing up. Retry later.",
                "type": "service_unavailable_error",
                "param": None,
                "code": "no_capacity",
            }
        }
        assert len(c.queue) == 0
        assert c.metrics.value("homing_admission_rejected_total", reason="timeout") == 1
        await c.stop()

    async def test_full_queue_is_503_at_once(self) -> None:
        """With the queue full a new request is refused without waiting."""
        clock = ManualClock()
        c = controller(Fleet(in_flight=1), clock, max_queued=1)
        first = asyncio.get_running_loop().create_task(c.admit("a", 0, "r1"))
        await clock.settle()
        with pytest.raises(APIError) as caught:
            await asyncio.wait_for(c.admit("b", 0, "r2"), 0.1)
        assert caught.value.body()["error"]["message"] == (
            "Every replica of model 'm' is overloaded and the admission queue is full; retry later."
        )
        first.cancel()
        await c.stop()

    async def test_cancelled_granted_waiter_passes_its_turn_on(self) -> None:
        """A request woken but cancelled before it ran hands the slot to the next waiter."""
        fleet = Fleet(in_flight=1)
        clock = ManualClock()
        c = controller(fleet, clock)
        loop = asyncio.get_running_loop()
        first = loop.create_task(c.admit("a", 0, "r1"))
        second = loop.create_task(c.admit("b", 0, "r2"))
        await clock.settle()
        fleet.in_flight = 0
        c.dispatch()  # wakes `first` ...
        first.cancel()  # ... which is gone before it runs
        await asyncio.wait_for(second, 0.5)
        assert first.cancelled()
        await c.stop()

    async def test_new_arrivals_do_not_barge_past_waiters(self) -> None:
        """While anyone waits, a newcomer queues behind even if capacity just freed."""
        fleet = Fleet(in_flight=1)
        clock = ManualClock()
        c = controller(fleet, clock, max_queued=4)
        loop = asyncio.get_running_loop()
        first = loop.create_task(c.admit("a", 0, "r1"))
        await clock.settle()
        fleet.in_flight = 0  # room now, but `first` has not been woken yet
        admitted: list[str] = []
        late = loop.create_task(c.admit("b", 0, "r2"))
        first.add_done_callback(lambda _: admitted.append("first"))
        late.add_done_callback(lambda _: admitted.append("late"))
        await clock.settle()
        assert admitted == [] and len(c.queue) == 2  # nobody barged past `first`
        for _ in range(4):  # the ticker wakes them, one per tick
            clock.advance(0.005)
            await clock.settle()
        await asyncio.wait_for(asyncio.gather(first, late), 0.5)
        assert admitted == ["first", "late"]
        await c.stop()


class TestHerd:
    def test_one_grant_per_replica_per_load_report(self) -> None:
        """A report below the KV threshold frees one waiter per replica; the next needs a
        newer report or one of our requests on it ending."""
        consumed: dict[str, tuple[float | None, int]] = {}
        report = WorkerSnapshot("w0", in_flight=3, token_usage=0.94, load_at=10.0)
        assert grantable([report], T, None, consumed) == report
        consumed["w0"] = (10.0, 4)  # granted; launched, in_flight 4
        same = WorkerSnapshot("w0", in_flight=4, token_usage=0.94, load_at=10.0)
        assert grantable([same], T, None, consumed) is None
        fresh = WorkerSnapshot("w0", in_flight=4, token_usage=0.94, load_at=10.5)
        assert grantable([fresh], T, None, consumed) == fresh
        ended = WorkerSnapshot("w0", in_flight=3, token_usage=0.94, load_at=10.0)
        assert grantable([ended], T, None, consumed) == ended
        full = WorkerSnapshot("w0", in_flight=3, waiting=1, token_usage=0.95, load_at=11.0)
        assert grantable([full], T, None, consumed) is None

    async def test_one_report_below_threshold_releases_one_waiter_not_the_queue(self) -> None:
        """With 20 queued and one report dipping below the KV threshold, one is admitted;
        a second report admits one more."""
        state = {"usage": 0.97, "at": 1.0, "in_flight": 8}

        def snaps() -> list[WorkerSnapshot]:
            return [
                WorkerSnapshot(
                    "w0",
                    in_flight=state["in_flight"],  # type: ignore[arg-type]
                    waiting=1,  # queueing: full KV then really means no room
                    token_usage=state["usage"],
                    load_at=state["at"],
                )
            ]

        clock = ManualClock()
        c = AdmissionController(
            AdmissionSettings(),
            model_id="m",
            snapshots=snaps,
            metrics=GatewayMetrics(),
            tick_s=0.001,
            clock=clock,
        )

        async def ticks(n: int) -> None:  # n ticks of the ticker, each run to its end
            for _ in range(n):
                clock.advance(0.001)
                await clock.settle()

        admitted = 0

        async def request(i: int) -> None:
            nonlocal admitted
            await c.admit(None, 0, str(i))
            admitted += 1
            state["in_flight"] += 1  # routed and launched

        tasks = [asyncio.create_task(request(i)) for i in range(20)]
        await ticks(20)
        assert (admitted, len(c.queue)) == (0, 20)
        state["usage"] = 0.94
        await ticks(50)
        assert admitted == 1
        state["at"] = 2.0
        await ticks(50)
        assert admitted == 2
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await c.stop()
