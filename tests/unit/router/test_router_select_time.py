"""`Router.select` decides at the time it is given: approximate credit recorded by a
dispatch lasts `approx_ttl_s` from that time, whatever the router's own clock says."""

from __future__ import annotations

from homing.clock import ManualClock
from homing.router import Router, RouteRequest, WorkerSnapshot

PROMPT = list(range(500, 564))  # four blocks of 16


def test_dispatch_credit_expires_by_the_decision_times_given() -> None:
    clock = ManualClock(1_000.0)  # never advanced: only the `now` arguments move time
    router = Router(clock=clock, approx_ttl_s=10.0)
    workers = [WorkerSnapshot("w0"), WorkerSnapshot("w1")]
    first = router.select(RouteRequest(PROMPT), workers, now=0.0)
    again = router.select(RouteRequest(PROMPT), workers, now=5.0)
    assert again.worker_id == first.worker_id and again.branch == "approx_hit"
    assert router.index.match(PROMPT) == {first.worker_id: 64}
    router.select(RouteRequest(list(range(900, 964))), workers, now=30.0)
    assert router.index.match(PROMPT) == {}  # recorded at 0 and 5 s, expired by 30 s
