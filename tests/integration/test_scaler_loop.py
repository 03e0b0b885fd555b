"""The autoscaler's shell (`homing.scaler.loop.PoolScaler`, `Scaler`) over a real `App` and
an in-memory actuator whose members are real simulated workers (`homing sim` children on
loopback): which members join the pool and how (ready or warm), which workers are promoted,
drained and stopped, and how replicas are counted for the policy.

Each test builds its own `PoolScaler` exactly as `App._start_scaler` does (the App's own
one, `dataclasses.replace`d onto a `SimActuator` of this file), and drives it directly: the
latest decision (`PoolScaler.last`), `apply`, `sync_members`, `Scaler.step`. The App's own
scaler ticks once an hour, and its worker `w0` (started by its local actuator) is capacity
the test's scaler did not start. Order comes from events (`helpers.eventually` over the
pool, the actuator's members and the scaler's own tasks), never from sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from helpers import eventually, own_app
from structlog.testing import capture_logs

from homing.app import App
from homing.clock import Clock
from homing.config import (
    GatewaySettings,
    HomingConfig,
    ModelSettings,
    RouterSettings,
    ScalerSettings,
    SimSettings,
)
from homing.engines.lifecycle import Phase
from homing.engines.pool import WorkerState
from homing.scaler.actuators.base import (
    ActuatorError,
    ColdStarts,
    Listeners,
    Member,
    MemberState,
)
from homing.scaler.loop import PoolScaler, ReplicaCounts, Scaler
from homing.scaler.policy import Decision, ScalerChain
from homing.sim.process import spawn_sim, terminate

pytestmark = pytest.mark.asyncio

MODEL = "llama-3.1-8b"
HOUR = 3600.0
#: Seconds a simulated worker may take to start, join or leave on a loaded 2-core host.
WITHIN_S = 60.0


class SimActuator:
    """An `Actuator` whose members are `homing sim` processes on loopback (one worker each).

    `start(count)` adds `count` STARTING members and spawns each one's process; a member is
    READY (with its URL) once its process is ready, or, while `held`, only at `release()`,
    which makes every spawned member READY in one change. A member whose process exits on
    its own is dropped (as the local actuator does). `stop` marks it STOPPING, waits for
    `stop_gate`, then SIGTERMs its process; with `fail_stops` it goes back to READY (the
    process still running) and raises ActuatorError instead. `asked`: every `start` count,
    in order; `stop_calls`: every member `stop` was called for. ActuatorError for a stop of
    a member it does not list (as the local actuator).
    """

    kind = "memory"

    def __init__(self, sim: SimSettings, clock: Clock) -> None:
        self.sim = sim
        self.clock = clock
        self.failed_starts = 0
        self.held = False
        self.fail_stops = False
        self.fail_starts_with: Exception | None = None
        self.stop_gate = asyncio.Event()
        self.stop_gate.set()
        self.asked: list[int] = []
        self.stop_calls: list[str] = []
        self.failed_stops = 0
        self.urls: dict[str, str] = {}  # member id -> its URL once its process is ready
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self._members: dict[str, Member] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._index = itertools.count()
        self._cold = ColdStarts()
        self._listeners = Listeners()

    async def open(self) -> None:
        """Nothing to do: it knows the members it spawned."""

    def members(self) -> list[Member]:
        """Members starting, ready or stopping, in the order they were asked for."""
        return list(self._members.values())

    def member(self, member_id: str) -> Member | None:
        """`member_id` as listed now (None: not listed)."""
        return self._members.get(member_id)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` whenever members change; returns the unsubscribe."""
        return self._listeners.subscribe(listener)

    def cold_start_s(self) -> float | None:
        """Median of the measured cold starts, seconds; None before one."""
        return self._cold.median()

    async def start(self, count: int, *, port: int = 0) -> None:
        """Add `count` STARTING members (on `port`, 0: a free one); `fail_starts_with` is
        raised instead when set."""
        self.asked.append(count)
        if self.fail_starts_with is not None:
            raise self.fail_starts_with
        now = self.clock.now()
        for _ in range(count):
            member_id = f"mem-{next(self._index)}"
            self._members[member_id] = Member(member_id, None, MemberState.STARTING, now, None)
            self._spawn(self._start(member_id, port))
        if count:
            self._listeners.notify()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, member_id: str, port: int) -> None:
        s = self.sim
        args = ["--workers", "1", "--host", "127.0.0.1", "--port", str(port)]
        args += ["--model", s.model, "--gpu", s.gpu, "--speedup", str(s.speedup)]
        if s.served_model_name:
            args += ["--served-model-name", s.served_model_name]
        args += ["--parent-pid", str(os.getpid())]
        process, ready = await spawn_sim(args)
        self.processes[member_id] = process
        self.urls[member_id] = ready["workers"][0]["url"]
        self._spawn(self._watch(member_id, process))
        if not self.held:
            self._ready([member_id])

    def _ready(self, member_ids: list[str]) -> None:
        now = self.clock.now()
        for member_id in member_ids:
            m = self._members[member_id]
            self._members[member_id] = dataclasses.replace(
                m, url=self.urls[member_id], state=MemberState.READY, ready_at=now
            )
            self._cold.add(now - m.asked_at)
        self._listeners.notify()

    def spawned(self) -> list[str]:
        """STARTING members whose process is ready (held back by `held`)."""
        return [
            i
            for i, m in self._members.items()
            if m.state is MemberState.STARTING and i in self.urls
        ]

    def release(self) -> None:
        """Every spawned STARTING member becomes READY, in one change."""
        self._ready(self.spawned())

    async def _watch(self, member_id: str, process: asyncio.subprocess.Process) -> None:
        await process.wait()
        m = self._members.get(member_id)
        if m is not None and m.state is not MemberState.STOPPING:  # it died on its own
            del self._members[member_id]
            self._listeners.notify()

    def kill(self, member_id: str) -> None:
        """SIGKILL `member_id`'s process (the actuator drops it once it has exited)."""
        self.processes[member_id].kill()

    async def stop(self, member_id: str) -> None:
        """Stop `member_id` (class docstring)."""
        self.stop_calls.append(member_id)
        m = self._members.get(member_id)
        if m is None:
            raise ActuatorError(f"no member {member_id!r} to stop")
        self._members[member_id] = dataclasses.replace(m, state=MemberState.STOPPING)
        self._listeners.notify()
        await self.stop_gate.wait()
        if self.fail_stops:
            self.failed_stops += 1
            self._members[member_id] = m
            self._listeners.notify()
            raise ActuatorError(f"stopping {member_id} failed (on demand)")
        process = self.processes.get(member_id)
        if process is not None:
            await terminate([process], 5.0)
        del self._members[member_id]
        self._listeners.notify()

    async def close(self) -> None:
        """Cancel what is in flight and stop every process it started."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await terminate(self.processes.values(), 5.0)


@dataclasses.dataclass
class Rig:
    """An App and, per model, the test's `PoolScaler` over its `SimActuator`."""

    app: App
    scalers: list[PoolScaler]
    actuators: list[SimActuator]

    @property
    def p(self) -> PoolScaler:
        return self.scalers[0]

    @property
    def act(self) -> SimActuator:
        return self.actuators[0]


def _config(models: list[str] | None, **scaler: Any) -> HomingConfig:
    settings = {
        "enabled": True,
        "tick_s": HOUR,  # nothing ticks but the test
        "min_replicas": 1,
        "max_replicas": 4,
        "headroom": 0.0,
        "warm_replicas": 0,
        "decode_streams_per_replica": 2.0,
        "prefill_tokens_per_s_per_replica": 1e9,
        "default_cold_start_s": 5.0,
        "startup_timeout_s": 60.0,
        **scaler,
    }
    sim = SimSettings(workers=1, speedup=10.0)
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        router=RouterSettings(policy="round_robin"),
        sim=sim,
        models=[ModelSettings(name=n, sim=sim) for n in models or []],
        scaler=ScalerSettings(**settings),
    )


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Callable[..., Any]]:
    """`await rig(models=None, **scaler settings)`: a started App and the test's scalers,
    all stopped at the end (scalers, then actuators, then the App)."""
    made: list[Rig] = []

    async def make(models: list[str] | None = None, **scaler: Any) -> Rig:
        cfg = _config(models, **scaler)
        app = own_app(cfg)
        await app.start()
        assert app.scaler is not None
        sims = {(m.name or MODEL): m.sim for m in cfg.served_models()}
        scalers, actuators = [], []
        for built in app.scaler.pools:
            sim = sims.get(built.model) or cfg.sim
            assert sim is not None
            act = SimActuator(sim, built.clock)
            p = dataclasses.replace(built, actuator=act)  # as `_start_scaler` built it
            actuators.append(act)
            scalers.append(p)
        r = Rig(app, scalers, actuators)
        made.append(r)
        for p in scalers:
            p.start()
        return r

    try:
        yield make
    finally:
        for r in made:
            for p in r.scalers:
                await p.close()
            for a in r.actuators:
                await a.close()
            await r.app.stop()


def _decision(ready: int, warm: int = 0) -> Decision:
    return Decision(
        desired_ready=ready, desired_warm=warm, reason="test", fast=False, chain=ScalerChain()
    )


def _worker(p: PoolScaler, url: str) -> WorkerState | None:
    return next((w for w in p.dispatch.pool.workers() if w.url == url), None)


def _phases(p: PoolScaler) -> list[str]:
    return sorted(w.phase.value for w in p.dispatch.pool.workers())


def _settled(p: PoolScaler) -> bool:
    """No join, drain-then-stop or stop of the scaler is in flight."""
    return not p._tasks


async def _joined(r: Rig, member_id: str, phase: Phase) -> WorkerState:
    """Wait until `member_id` is READY and its worker is in the pool in `phase`."""
    act, p = r.act, r.p

    def check() -> bool:
        url = act.urls.get(member_id)
        w = _worker(p, url) if url is not None else None
        return w is not None and w.phase is phase and _settled(p)

    assert await eventually(check, WITHIN_S), (act.members(), _phases(p))
    w = _worker(p, act.urls[member_id])
    assert w is not None
    return w


async def _start_one(r: Rig) -> str:
    """Ask the actuator itself (not the scaler) for one member; its id."""
    before = {m.member_id for m in r.act.members()}
    await r.act.start(1)
    (member_id,) = {m.member_id for m in r.act.members()} - before
    return member_id


async def test_a_member_that_dies_is_drained_out_and_nothing_joins_under_its_url(
    rig: Any,
) -> None:
    """A joined member's process is killed; the actuator drops it, and the scaler drains its
    worker out of the pool. Later syncs and ticks join nothing under the dead URL."""
    r = await rig()
    p, act = r.p, r.act
    p.last = _decision(2)
    member = await _start_one(r)
    w = await _joined(r, member, Phase.READY)
    act.kill(member)
    assert await eventually(lambda: act.member(member) is None, WITHIN_S)
    assert await p.dispatch.pool.wait_gone(w.worker_id, WITHIN_S)
    scaler = Scaler([p], clock=p.clock, tick_s=HOUR)
    for _ in range(3):
        p.sync_members()
        await scaler.step()
        assert await eventually(lambda: _settled(p), WITHIN_S)
        assert _worker(p, w.url) is None, _phases(p)
    assert [x.worker_id for x in p.dispatch.pool.workers()] == ["w0"]


async def test_a_new_member_at_a_dead_members_url_joins(rig: Any) -> None:
    """A member dies and is drained out; the actuator then starts a new member that is
    given the same address (a reused port or pod IP): it joins, as any new member does."""
    r = await rig()
    p, act = r.p, r.act
    p.last = _decision(2)
    member = await _start_one(r)
    w = await _joined(r, member, Phase.READY)
    act.kill(member)
    assert await p.dispatch.pool.wait_gone(w.worker_id, WITHIN_S)
    assert await eventually(lambda: act.member(member) is None and _settled(p), WITHIN_S)
    port = int(w.url.rsplit(":", 1)[1])
    before = {m.member_id for m in act.members()}
    await act.start(1, port=port)
    (again,) = {m.member_id for m in act.members()} - before
    assert await eventually(lambda: act.urls.get(again) == w.url, WITHIN_S), act.urls
    assert await eventually(lambda: _worker(p, w.url) is not None, 10.0), sorted(p._retiring)


async def test_an_operator_cordoned_worker_is_never_promoted(rig: Any) -> None:
    """One member joined ready and an operator cordoned it (`Fleet.cordon`); a second joined
    warm. A decision that the pool is short by two promotes the warm one only and asks the
    actuator for one more: the operator's cordon stays."""
    r = await rig()
    p, act, fleet = r.p, r.act, r.app.fleet
    assert fleet is not None
    p.last = _decision(2)
    first = await _start_one(r)
    cordoned = await _joined(r, first, Phase.READY)
    fleet.cordon(cordoned.worker_id)
    p.last = _decision(1, warm=1)  # w0 is ready: a new member joins warm
    second = await _start_one(r)
    warm = await _joined(r, second, Phase.CORDONED)
    assert p.counts().warm == 1 and p.counts().ready == 1
    act.held = True  # what it starts now stays STARTING
    d = _decision(3)
    p.last = d
    await p.apply(d)
    pool = p.dispatch.pool
    assert pool.state(warm.worker_id).phase is Phase.READY  # promoted
    assert pool.state(cordoned.worker_id).phase is Phase.CORDONED
    assert act.asked[-1] == 1, act.asked
    d = _decision(4)  # shorter still: still not promoted
    p.last = d
    await p.apply(d)
    assert pool.state(cordoned.worker_id).phase is Phase.CORDONED
    assert p.counts().warm == 0


async def test_two_members_ready_at_once_when_short_by_one_join_one_ready_one_warm(
    rig: Any,
) -> None:
    """The latest decision wants two ready replicas and the pool has one (w0); two members
    become READY in the same change: one joins ready, the other warm (cordoned)."""
    r = await rig()
    p, act = r.p, r.act
    p.last = _decision(2)
    act.held = True
    await act.start(2)
    assert await eventually(lambda: len(act.spawned()) == 2, WITHIN_S), act.members()
    assert p.counts().starting == 2
    act.release()
    assert await eventually(
        lambda: _phases(p) == ["cordoned", "ready", "ready"] and _settled(p), WITHIN_S
    ), _phases(p)
    assert p.counts() == ReplicaCounts(ready=2, warm=1, starting=0, draining=0, ejected=0)


async def test_members_starting_for_the_warm_pool_are_warm_starting_not_starting(
    rig: Any,
) -> None:
    """A decision for the ready replicas the pool has (w0) and 2 warm ones starts 2 members;
    while they start the policy sees them as `warm_starting`, not as `starting` (capacity
    on its way for the ready target); a decision wanting 1 warm one sees 1 of each."""
    r = await rig()
    p, act = r.p, r.act
    act.held = True
    d = _decision(1, warm=2)
    p.last = d
    await p.apply(d)
    assert act.asked == [2]
    assert await eventually(lambda: len(act.spawned()) == 2, WITHIN_S), act.members()
    s = p.signals()
    assert (p.counts().starting, s.starting, s.warm_starting, s.warm) == (2, 0, 2, 0)
    p.last = _decision(1, warm=1)
    s = p.signals()
    assert (s.starting, s.warm_starting) == (1, 1)


async def test_a_stopping_member_is_not_counted_as_starting(rig: Any) -> None:
    """A member asked for counts as starting; once it is STOPPING (its stop held open) it no
    longer does, in `counts()` nor in the policy's signals."""
    r = await rig()
    p, act = r.p, r.act
    act.held = True
    member = await _start_one(r)
    assert p.counts().starting == 1 and p.signals().starting == 1
    assert await eventually(lambda: act.spawned() == [member], WITHIN_S)
    act.stop_gate.clear()
    stopping = asyncio.create_task(act.stop(member))
    try:
        assert await eventually(
            lambda: (m := act.member(member)) is not None and m.state is MemberState.STOPPING,
            10.0,
        )
        assert p.counts().starting == 0
        assert p.signals().starting == 0
    finally:
        act.stop_gate.set()
        await stopping
    assert act.members() == []


async def test_a_victim_whose_stop_fails_stays_retired(rig: Any) -> None:
    """Scale-down picks the scaler's own member (w0 is not its own) and drains it; once its
    worker has left, its stop fails and the member is READY again, its process alive. The
    next syncs and ticks do not join it back, nor count it as starting."""
    r = await rig()
    p, act = r.p, r.act
    p.last = _decision(2)
    member = await _start_one(r)
    w = await _joined(r, member, Phase.READY)
    act.fail_stops = True
    d = _decision(1)
    p.last = d
    await p.apply(d)
    assert await p.dispatch.pool.wait_gone(w.worker_id, WITHIN_S)
    assert await eventually(lambda: act.failed_stops == 1 and _settled(p), WITHIN_S)
    m = act.member(member)
    assert act.stop_calls == [member] and m is not None and m.state is MemberState.READY
    assert act.processes[member].returncode is None  # still running: it could join
    scaler = Scaler([p], clock=p.clock, tick_s=HOUR)
    for _ in range(3):
        p.sync_members()
        await scaler.step()
        assert await eventually(lambda: _settled(p), WITHIN_S)
        assert _worker(p, w.url) is None, _phases(p)
        assert p.counts().starting == 0


async def test_advisory_mode_follows_membership_and_starts_and_stops_nothing(
    rig: Any,
) -> None:
    """Advisory: a member the actuator reports READY joins the pool (ready: the decision
    wants more); decisions up and down then start nothing, drain nothing, stop nothing."""
    r = await rig(mode="advisory")
    p, act = r.p, r.act
    assert p.advisory
    p.reconfigure(dataclasses.replace(p.config, min_replicas=3))
    scaler = Scaler([p], clock=p.clock, tick_s=HOUR)
    d = (await scaler.step())[p.model]
    assert d.desired_ready == 3 and act.asked == []
    member = await _start_one(r)  # the actuator's own doing (an operator's script)
    w = await _joined(r, member, Phase.READY)
    await scaler.step()
    for d in (_decision(4, warm=1), _decision(0)):
        p.last = d
        await p.apply(d)
    assert await eventually(lambda: _settled(p), WITHIN_S)
    assert act.asked == [1]  # the test's own start only
    assert act.stop_calls == []
    assert _phases(p) == ["ready", "ready"] and p.dispatch.pool.has(w.worker_id)


async def test_advisory_mode_asks_no_stop_for_a_member_that_died(rig: Any) -> None:
    """Advisory: a joined member dies; the scaler follows (its worker is drained out) but
    calls no `stop` on the actuator: an exec script or Kubernetes is never acted on."""
    r = await rig(mode="advisory")
    p, act = r.p, r.act
    p.last = _decision(2)
    member = await _start_one(r)
    w = await _joined(r, member, Phase.READY)
    act.kill(member)
    assert await p.dispatch.pool.wait_gone(w.worker_id, WITHIN_S)
    assert await eventually(lambda: _settled(p), WITHIN_S)
    assert act.stop_calls == []


async def test_a_step_with_one_pool_whose_apply_raises_still_applies_the_other(
    rig: Any,
) -> None:
    """Two models, each short of its two-replica minimum; the first pool's actuator raises
    an unforeseen error on start (not ActuatorError: it escapes `apply`). The step still
    returns both decisions and the second pool's actuator is asked for its replica."""
    r = await rig(models=["alpha", "beta"])  # one replica each at the start
    first, second = r.scalers
    for p in r.scalers:
        p.reconfigure(dataclasses.replace(p.config, min_replicas=2))
    assert (first.model, second.model) == ("alpha", "beta")
    r.actuators[0].fail_starts_with = RuntimeError("boom")
    r.actuators[1].held = True  # asked is enough; it need not come up
    scaler = Scaler([first, second], clock=first.clock, tick_s=HOUR)
    with capture_logs() as logs:
        decisions = await scaler.step()
    assert {m: d.desired_ready for m, d in decisions.items()} == {"alpha": 2, "beta": 2}
    failed = [e for e in logs if e["event"] == "scaler_apply_failed"]
    assert [(e["model"], e["error"]) for e in failed] == [("alpha", "RuntimeError('boom')")]
    assert r.actuators[0].asked == [1]  # it was asked, and raised
    assert r.actuators[1].asked == [1]
