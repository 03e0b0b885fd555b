"""Virtual-time driver of the pure scheduler: a whole workload in seconds of CPU, no sockets.

Rule of this file: the same `Scheduler` the live worker runs, stepped on a `ManualClock` that
jumps by each step's duration (or to the next arrival when idle). A step's tokens become visible
when its time is up, as in `homing.sim.engine_loop`. Nothing here sleeps or reads a real clock,
so a run is deterministic for a given workload.

`run_closed_loop` models `users` clients that each send a request, wait for its last token,
and send the next one at once (zero think time): the running batch settles near `users`.
First arrivals are spread evenly over `stagger_s` so the users do not move in lockstep.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from homing.clock import ManualClock
from homing.sim.scheduler import RequestFinished, Scheduler, SimRequest


@dataclass(frozen=True)
class RequestRecord:
    """Timings of one finished request (seconds of virtual time).

    ttft_s: arrival to first token; tpot_s: (last token - first token) / (tokens - 1), or None
    for answers of fewer than two tokens; mean_running: average running batch over the steps
    that produced its tokens after the first.
    """

    request_id: str
    arrival_s: float
    ttft_s: float
    tpot_s: float | None
    completion_tokens: int
    cached_tokens: int
    mean_running: float


@dataclass(frozen=True)
class ClosedLoopResult:
    """A closed-loop run: the records of requests that arrived after the warm-up, the
    time-averaged running batch over the measured window, and the retractions counted."""

    records: tuple[RequestRecord, ...]
    mean_running: float
    retractions: int
    steps: int

    def tpot_percentile(self, q: float) -> float:
        """The q-th percentile (0-100, nearest rank) of per-request TPOT in seconds.
        Raises ValueError when no request has a TPOT."""
        values = sorted(r.tpot_s for r in self.records if r.tpot_s is not None)
        if not values:
            raise ValueError("no request produced two or more tokens")
        rank = max(math.ceil(q / 100.0 * len(values)), 1)
        return values[rank - 1]


@dataclass
class _Open:
    arrival: float
    user: int
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    running_sum: float = 0.0
    running_steps: int = 0


def run_closed_loop(
    scheduler: Scheduler,
    make_request: Callable[[int, int], SimRequest],
    *,
    users: int,
    duration_s: float,
    warmup_s: float,
    stagger_s: float,
    clock: ManualClock | None = None,
    max_steps: int = 1_000_000,
) -> ClosedLoopResult:
    """Run `users` closed-loop clients for `duration_s` of virtual time.

    make_request(user, n) builds user's n-th request (n from 0; request ids must be unique).
    Requests that arrive before `warmup_s` are not recorded, nor is the running batch before
    it. Raises ValueError for users < 1 or duration_s <= warmup_s.
    """
    if users < 1:
        raise ValueError(f"users must be >= 1, got {users}")
    if duration_s <= warmup_s:
        raise ValueError("duration_s must exceed warmup_s")
    clock = clock or ManualClock()
    start = clock.now()
    arrivals: list[tuple[float, int, int]] = [
        (start + stagger_s * user / users, user, 0) for user in range(users)
    ]
    heapq.heapify(arrivals)
    counts = [0] * users
    open_requests: dict[str, _Open] = {}
    records: list[RequestRecord] = []
    running_time = 0.0
    measured_time = 0.0
    retractions = 0
    steps = 0
    end = start + duration_s
    while clock.now() < end and steps < max_steps:
        now = clock.now()
        while arrivals and arrivals[0][0] <= now:
            at, user, _ = heapq.heappop(arrivals)
            request = make_request(user, counts[user])
            counts[user] += 1
            scheduler.add_request(request, now)
            open_requests[request.request_id] = _Open(arrival=at, user=user)
        if not scheduler.has_work:
            if not arrivals:
                break
            clock.advance(max(arrivals[0][0] - now, 0.0))
            continue
        result = scheduler.step(now)
        steps += 1
        retractions += result.retracted
        duration = result.duration_s
        if not result.did_work and not result.finished:
            raise RuntimeError("the scheduler cannot make progress")
        running = scheduler.num_running + len(result.finished)
        if now >= start + warmup_s:
            running_time += running * duration
            measured_time += duration
        clock.advance(duration)
        done_at = clock.now()
        for output in result.outputs:
            state = open_requests[output.request_id]
            if state.first is None:
                state.first = done_at
            else:
                state.running_sum += running
                state.running_steps += 1
            state.last = done_at
            state.tokens = output.completion_tokens
        for finished in result.finished:
            state = open_requests.pop(finished.request_id)
            heapq.heappush(arrivals, (done_at, state.user, counts[state.user]))
            if state.arrival >= start + warmup_s:
                records.append(_record(finished, state))
    return ClosedLoopResult(
        records=tuple(records),
        mean_running=running_time / measured_time if measured_time else 0.0,
        retractions=retractions,
        steps=steps,
    )


def _record(finished: RequestFinished, state: _Open) -> RequestRecord:
    first = state.first if state.first is not None else state.arrival
    last = state.last if state.last is not None else first
    tokens = finished.completion_tokens
    return RequestRecord(
        request_id=finished.request_id,
        arrival_s=state.arrival,
        ttft_s=first - state.arrival,
        tpot_s=(last - first) / (tokens - 1) if tokens > 1 else None,
        completion_tokens=tokens,
        cached_tokens=finished.cached_tokens,
        mean_running=state.running_sum / state.running_steps if state.running_steps else 0.0,
    )
