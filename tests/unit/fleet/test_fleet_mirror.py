"""A follower's fleet follows the leader's worker list (`homing.fleet.mirror`): the pure
decision `mirror_actions`, one rule per test, then `FleetMirror` applying it to a real
`Fleet` over in-process fake engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from homing.clock import ManualClock
from homing.engines.lifecycle import Phase
from homing.engines.testing import FakeEngine
from homing.fleet import Fleet
from homing.fleet.mirror import (
    FleetMirror,
    LeaderWorker,
    MirrorAction,
    OwnWorker,
    leader_workers,
    mirror_actions,
    own_workers,
)
from homing.fleet.testing import BuiltDispatch, dispatch_over
from homing.v1 import admin_pb2 as pb

A = "grpc://10.0.0.1:50051"
B = "grpc://10.0.0.2:50051"
C = "grpc://10.0.0.3:50051"
SERVED = {"llama"}
SERVED_THERE = [Phase.JOINING, Phase.READY, Phase.CORDONED, Phase.EJECTED]


def lead(url: str, phase: Phase, *, model: str = "llama", version: str = "v1") -> LeaderWorker:
    return LeaderWorker(model, url, version, phase)


def mine(url: str, phase: Phase, worker_id: str = "w0", *, model: str = "llama") -> OwnWorker:
    return OwnWorker(model, worker_id, url, phase)


def decide(
    leader: Sequence[LeaderWorker], own: Sequence[OwnWorker], served: set[str] = SERVED
) -> list[tuple[str, str, str | None]]:
    """(kind, url, worker_id) of each action, in order."""
    return [(a.kind, a.url, a.worker_id) for a in mirror_actions(leader, own, served=served)]


# -- mirror_actions --


@pytest.mark.parametrize("phase", SERVED_THERE)
def test_a_worker_the_leader_serves_and_the_follower_lacks_is_added(phase: Phase) -> None:
    """joining, ready, cordoned and ejected on the leader all mean "serve it" (ejection is
    the leader's own judgement): added with the leader's model and version."""
    [action] = mirror_actions([lead(A, phase, version="v7")], [], served=SERVED)
    assert action == MirrorAction("add", "llama", A, "v7", None)


@pytest.mark.parametrize("phase", [Phase.DRAINING, Phase.GONE])
def test_a_worker_leaving_the_leader_is_not_added(phase: Phase) -> None:
    assert decide([lead(A, phase)], []) == []


def test_adds_follow_the_leaders_order() -> None:
    leader = [lead(C, Phase.READY), lead(A, Phase.JOINING), lead(B, Phase.CORDONED)]
    assert decide(leader, []) == [("add", C, None), ("add", A, None), ("add", B, None)]


def test_a_worker_of_a_model_the_follower_does_not_serve_is_skipped() -> None:
    leader = [lead(A, Phase.READY, model="mistral"), lead(B, Phase.READY)]
    assert decide(leader, []) == [("add", B, None)]


def test_urls_match_in_canonical_form() -> None:
    """The leader's `grpc://LOCALHOST:050051` is the follower's `grpc://127.0.0.1:50051`."""
    leader = [lead("grpc://LOCALHOST:050051", Phase.READY)]
    assert decide(leader, [mine("grpc://127.0.0.1:50051", Phase.READY)]) == []
    [add] = mirror_actions(leader, [], served=SERVED)
    assert add.url == "grpc://127.0.0.1:50051"


@pytest.mark.parametrize("phase", [Phase.READY, Phase.CORDONED, Phase.EJECTED, Phase.JOINING])
def test_a_worker_the_leader_no_longer_lists_is_drained(phase: Phase) -> None:
    assert decide([], [mine(A, phase, "w3")]) == [("drain", A, "w3")]


@pytest.mark.parametrize("leader_phase", [Phase.DRAINING, Phase.GONE])
def test_a_worker_draining_or_gone_on_the_leader_is_drained(leader_phase: Phase) -> None:
    assert decide([lead(A, leader_phase)], [mine(A, Phase.READY, "w3")]) == [("drain", A, "w3")]


@pytest.mark.parametrize("leader", [[], [lead(A, Phase.DRAINING)], [lead(A, Phase.GONE)]])
def test_a_worker_already_draining_is_not_drained_again(leader: list[LeaderWorker]) -> None:
    assert decide(leader, [mine(A, Phase.DRAINING)]) == []


def test_a_worker_listed_under_another_model_is_drained_and_not_added_until_it_left() -> None:
    """Same URL, other model on the leader: ours is drained; the add waits for a round
    where ours is gone (the fleet would refuse it as a duplicate meanwhile)."""
    leader = [lead(A, Phase.READY, model="other")]
    own = [mine(A, Phase.READY, "w1", model="llama")]
    assert decide(leader, own, {"llama", "other"}) == [("drain", A, "w1")]
    assert decide(leader, [], {"llama", "other"}) == [("add", A, None)]


def test_leader_cordoned_and_follower_ready_cordons() -> None:
    assert decide([lead(A, Phase.CORDONED)], [mine(A, Phase.READY, "w2")]) == [("cordon", A, "w2")]


def test_leader_cordoned_and_follower_ejected_cordons() -> None:
    """The operator's cordon takes over an ejection (lifecycle: ejected --cordon-->), so
    the worker stays out when this process would readmit it."""
    assert decide([lead(A, Phase.CORDONED)], [mine(A, Phase.EJECTED, "w2")]) == [
        ("cordon", A, "w2")
    ]


def test_leader_cordoned_and_follower_joining_waits_for_the_join() -> None:
    """A joining worker cannot be cordoned; the round after it joins cordons it."""
    assert decide([lead(A, Phase.CORDONED)], [mine(A, Phase.JOINING)]) == []


@pytest.mark.parametrize("leader_phase", [Phase.READY, Phase.JOINING, Phase.EJECTED])
def test_leader_not_cordoned_and_follower_cordoned_uncordons(leader_phase: Phase) -> None:
    """ready (the operator uncordoned), and joining or ejected, which a cordoned worker
    cannot be on the leader without being uncordoned (or re-added) first."""
    assert decide([lead(A, leader_phase)], [mine(A, Phase.CORDONED, "w4")]) == [
        ("uncordon", A, "w4")
    ]


@pytest.mark.parametrize("leader_phase", SERVED_THERE)
def test_a_follower_draining_what_the_leader_serves_is_undrained(leader_phase: Phase) -> None:
    """The operator undrained it on the leader (or re-added it)."""
    assert decide([lead(A, leader_phase)], [mine(A, Phase.DRAINING, "w5")]) == [
        ("undrain", A, "w5")
    ]


@pytest.mark.parametrize(
    ("leader_phase", "own_phase"),
    [
        (Phase.READY, Phase.READY),
        (Phase.CORDONED, Phase.CORDONED),
        (Phase.READY, Phase.EJECTED),  # ejection is this process's own judgement
        (Phase.EJECTED, Phase.READY),
        (Phase.READY, Phase.JOINING),  # health is this process's own
        (Phase.JOINING, Phase.READY),
    ],
)
def test_a_worker_in_step_needs_nothing(leader_phase: Phase, own_phase: Phase) -> None:
    assert decide([lead(A, leader_phase)], [mine(A, own_phase)]) == []


def test_a_gone_follower_worker_counts_as_absent() -> None:
    assert decide([lead(A, Phase.READY)], [mine(A, Phase.GONE)]) == [("add", A, None)]
    assert decide([], [mine(A, Phase.GONE)]) == []


def test_a_url_listed_twice_counts_as_its_served_entry() -> None:
    """While an old worker of a URL leaves the leader and a new one of it joins, the new
    one decides: ours stays, and is undrained when it was draining."""
    leader = [lead(A, Phase.DRAINING), lead(A, Phase.JOINING)]
    assert decide(leader, [mine(A, Phase.READY)]) == []
    assert decide(leader, [mine(A, Phase.DRAINING, "w1")]) == [("undrain", A, "w1")]
    assert decide(leader, []) == [("add", A, None)]


def test_changes_come_in_own_order_then_adds_in_leader_order() -> None:
    leader = [lead(C, Phase.READY), lead(A, Phase.CORDONED)]
    own = [mine(B, Phase.READY, "w1"), mine(A, Phase.READY, "w0")]
    assert decide(leader, own) == [("drain", B, "w1"), ("cordon", A, "w0"), ("add", C, None)]
    assert decide(leader, own) == decide(leader, own)


def test_leader_workers_reads_a_list_workers_answer() -> None:
    response = pb.ListWorkersResponse(
        workers=[pb.Worker(id="w9", model="llama", url=A, version="v2", phase="cordoned")]
    )
    assert leader_workers(response) == [LeaderWorker("llama", A, "v2", Phase.CORDONED)]


def test_leader_workers_refuses_a_phase_it_does_not_know() -> None:
    with pytest.raises(ValueError):
        leader_workers(pb.ListWorkersResponse(workers=[pb.Worker(url=A, phase="resting")]))


# -- FleetMirror over a real Fleet --


class Leader:
    """The leader's list as a test edits it; `fail` makes the next reads raise."""

    def __init__(self) -> None:
        self.workers: list[LeaderWorker] = []
        self.fail: Exception | None = None
        self.reads = 0

    async def __call__(self) -> list[LeaderWorker]:
        self.reads += 1
        if self.fail is not None:
            raise self.fail
        return list(self.workers)


@pytest_asyncio.fixture
async def built() -> AsyncIterator[BuiltDispatch]:
    """A follower's model "fake-model" over two fake engines, w0 and w1 (both ready)."""
    async with dispatch_over({"w0": FakeEngine(), "w1": FakeEngine()}) as b:
        yield b


@pytest_asyncio.fixture
async def fleet(built: BuiltDispatch) -> AsyncIterator[Fleet]:
    f = Fleet([built.dispatch])
    yield f
    await f.stop()


def as_leader(fleet: Fleet, phases: dict[str, Phase]) -> list[LeaderWorker]:
    """The follower's own workers as a leader in `phases` (by worker id) would list them."""
    return [
        LeaderWorker(w.model, w.url, "", phases.get(w.worker_id, Phase.READY))
        for w in own_workers(fleet)
    ]


def phases(fleet: Fleet) -> dict[str, Phase]:
    return {w.worker_id: w.phase for _, w in fleet.workers()}


async def test_sync_once_applies_cordon_uncordon_drain_undrain_to_the_fleet(
    built: BuiltDispatch, fleet: Fleet
) -> None:
    clock = ManualClock()
    leader = Leader()
    mirror = FleetMirror(fleet, leader, clock=clock)
    lease = built.dispatch.lease([1, 2, 3])  # an open request keeps a draining worker
    busy = lease.worker_id
    idle = "w1" if busy == "w0" else "w0"
    leader.workers = as_leader(fleet, {idle: Phase.CORDONED, busy: Phase.DRAINING})

    applied = await mirror.sync_once()

    assert sorted(a.kind for a in applied) == ["cordon", "drain"]
    assert phases(fleet) == {idle: Phase.CORDONED, busy: Phase.DRAINING}
    leader.workers = as_leader(fleet, {idle: Phase.READY, busy: Phase.READY})
    assert sorted(a.kind for a in await mirror.sync_once()) == ["uncordon", "undrain"]
    assert phases(fleet) == {idle: Phase.READY, busy: Phase.READY}
    assert await mirror.sync_once() == []  # in step: nothing more


async def test_a_refused_action_is_logged_and_the_round_goes_on(fleet: Fleet) -> None:
    """An add the fleet refuses (a malformed URL) does not stop the drain beside it."""
    leader = Leader()
    leader.workers = [
        *as_leader(fleet, {"w0": Phase.DRAINING}),
        LeaderWorker("fake-model", "grpc://no port", "", Phase.READY),
    ]
    mirror = FleetMirror(fleet, leader, clock=ManualClock())
    with capture_logs() as logs:
        applied = await mirror.sync_once()
    assert [(a.kind, a.worker_id) for a in applied] == [("drain", "w0")]
    [failed] = [e for e in logs if e["event"] == "mirror_action_failed"]
    assert failed["kind"] == "add" and failed["code"] == "INVALID_ARGUMENT"


async def test_run_logs_a_failed_read_and_retries_next_interval(fleet: Fleet) -> None:
    clock = ManualClock()
    leader = Leader()
    leader.fail = ConnectionError("leader away")
    mirror = FleetMirror(fleet, leader, clock=clock, interval_s=2.0)
    with capture_logs() as logs:
        task = asyncio.create_task(mirror.run())
        try:
            await clock.settle()
            assert leader.reads == 1 and clock.deadlines() == [2.0]
            leader.fail = None
            leader.workers = as_leader(fleet, {"w1": Phase.CORDONED})
            clock.advance(1.9)
            await clock.settle()
            assert leader.reads == 1  # not before the interval
            clock.advance(0.1)
            await clock.settle()
            assert leader.reads == 2 and phases(fleet)["w1"] is Phase.CORDONED
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    [failed] = [e for e in logs if e["event"] == "mirror_read_failed"]
    assert failed["error"] == "leader away"


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FleetMirror(Fleet([]), Leader(), clock=ManualClock(), interval_s=0)
