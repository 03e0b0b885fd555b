"""The autoscaler's I/O shell: signals in, decisions out, through the pool and an actuator.

Rule of this file: every `tick_s` (on the injected clock) `Scaler.step` builds one
`PoolSignals` per pool from what the gateway already measures (the pool's workers and their
engine load, the admission queue, the model's `DemandMeter`, its SLO tracker, the replica
snapshots), asks each pool's `ScalingPolicy` for a decision, trims the decisions to the GPU
budget (`homing.scaler.budget.apportion`) and, in active mode, applies them; in advisory
mode it only logs (`scaler_decision`) and exports them (`homing.scaler.metrics`).

Applying a decision to a pool, with no await between reading the pool and changing it:
- more ready replicas wanted: warm ones are promoted first (uncordoned, at once), then the
  actuator is asked for the rest (minus those already starting);
- fewer: the cheapest victims (`homing.scaler.victim`: fewest streams, least cache value
  from the router's index) are drained through the fleet, with a drain timeout above the
  longest request (`drain_timeout_s`), so no stream is cut; once a victim has left the
  pool its member is stopped. A victim goes warm instead (cordoned, kept) while the warm
  pool is short;
- the warm pool: started-but-idle replicas are workers of the pool joined cordoned
  (`WorkerSpec.warm`: discovered, probed and subscribed to, taking no requests); more are
  asked of the actuator, extra ones are drained (idle: they leave at once) and stopped.
A member the actuator reports ready joins the pool as ready while the pool is short of the
latest decision's ready replicas, else warm. Workers the scaler did not start (listed in
the config, added by an operator) count as capacity and are never victims.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from homing.clock import Clock
from homing.engines.lifecycle import IllegalTransition, Phase
from homing.engines.pool import WorkerRefused, WorkerSpec, WorkerState
from homing.fleet import Fleet, ModelDispatch
from homing.fleet.fleet import FleetError
from homing.obs.demand import DemandMeter
from homing.obs.replica import ReplicaSnapshot
from homing.scaler.actuators.base import Actuator, ActuatorError, MemberState
from homing.scaler.budget import apportion
from homing.scaler.capacity import CapacityEstimator, ReplicaSample
from homing.scaler.leader import Elector, SingleElector
from homing.scaler.metrics import ScalerMetrics
from homing.scaler.policy import Decision, PoolSignals, ScalerConfig, ScalingPolicy
from homing.scaler.victim import VictimCandidate, choose_victims

log = structlog.get_logger("homing.scaler")

#: Seconds of replica records a tick's capacity samples summarise (the snapshots' window).
SAMPLE_WINDOW_S = 15.0


@dataclass(frozen=True)
class ReplicaCounts:
    """One pool's replicas by state at one moment (`PoolScaler.counts`).

    ready: ready and healthy. warm: cordoned by the scaler. starting: asked of the actuator
    and not stopping, joining, or ready and not joined yet (neither retired nor refused).
    draining: being drained. ejected: taken out by outlier ejection.
    """

    ready: int
    warm: int
    starting: int
    draining: int
    ejected: int


@dataclass
class PoolScaler:
    """The autoscaler of one model's pool.

    `dispatch`: the model. `fleet`: drains go through it. `actuator`: starts and stops its
    replicas. `demand`: the model's meter. `snapshot`: a worker's replica snapshot over a
    window (seconds). `burn_rate`: the SLO's fast-window burn rate (None: no SLO data).
    `ttft_slo_s`: the SLO's TTFT target. `advisory`: decide and report, never act.
    `elector`: whether this instance actuates the pool (a follower decides, reports and
    follows membership); each actuator call is fenced by `Elector.still_leader`.
    `drain_timeout_s`: a victim's drain timeout (above the longest request, so none is cut).
    `gpus_per_replica`: for the GPU budget.
    """

    dispatch: ModelDispatch
    fleet: Fleet
    actuator: Actuator
    config: ScalerConfig
    estimator: CapacityEstimator
    demand: DemandMeter
    snapshot: Callable[[WorkerState, float], ReplicaSnapshot]
    burn_rate: Callable[[], float | None]
    ttft_slo_s: float | None
    clock: Clock
    advisory: bool = False
    drain_timeout_s: float = 630.0
    version: str = ""
    metrics: ScalerMetrics | None = None
    elector: Elector = field(default_factory=SingleElector)
    policy: ScalingPolicy = field(init=False)
    last: Decision | None = field(default=None, init=False)
    last_signals: PoolSignals | None = field(default=None, init=False)
    _warm: set[str] = field(default_factory=set, init=False)  # worker ids kept warm
    _owned: dict[str, str] = field(default_factory=dict, init=False)  # url -> member id
    _joining: dict[str, bool] = field(default_factory=dict, init=False)  # url -> joins ready
    _retiring: set[str] = field(default_factory=set, init=False)  # urls drained to be stopped
    _refused: set[str] = field(default_factory=set, init=False)  # urls the pool refused
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _unsubscribe: Callable[[], None] | None = field(default=None, init=False)
    _failed_seen: int = field(default=0, init=False)
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.policy = ScalingPolicy(self.config)

    @property
    def model(self) -> str:
        """The model's served name."""
        return self.dispatch.model_id

    def reconfigure(self, config: ScalerConfig) -> None:
        """Decide with `config` from the next tick on (the policy keeps its history)."""
        self.config = config
        self.policy.config = config

    # -- membership --

    def start(self) -> None:
        """Follow the actuator's members (joining ready ones to the pool)."""
        self._unsubscribe = self.actuator.subscribe(self.sync_members)
        self.sync_members()

    def sync_members(self) -> None:
        """Join each ready member not in the pool yet (never one being retired or refused),
        and drain each worker whose member is gone. Following is not acting: advisory mode
        does it too."""
        if self._closed:
            return
        pool = self.dispatch.pool
        in_pool = {w.url: w for w in pool.workers()}
        members = self.actuator.members()
        owned = {m.url: m.member_id for m in members if m.url is not None}
        # Keep the URLs of our workers still in the pool (their member may be gone).
        for url, member in self._owned.items():
            if url in in_pool and url not in owned:
                owned[url] = member
        self._owned = owned
        for m in members:
            url = m.url
            if (
                m.state is MemberState.READY
                and url is not None
                and url not in in_pool
                and url not in self._joining
                and url not in self._retiring
                and url not in self._refused
            ):
                self._joining[url] = self._joins_ready()
                self._spawn(self._join(url), f"scaler-join-{self.model}")
        live = {m.url for m in members if m.url is not None and m.state is not MemberState.STOPPING}
        for url, w in in_pool.items():  # its member is gone (died, deleted): let it go
            if url in owned and url not in live and url not in self._retiring:
                self._warm.discard(w.worker_id)
                self._drain(w.worker_id, reason="member_gone")

    def _joins_ready(self) -> bool:
        """Whether a member joining now joins ready: the pool's ready workers and the joins
        already decided ready fall short of the latest decision."""
        want = self.last.desired_ready if self.last is not None else 0
        ready = sum(1 for w in self.dispatch.pool.workers() if w.phase is Phase.READY)
        return ready + sum(self._joining.values()) < want

    async def _join(self, url: str) -> None:
        pool = self.dispatch.pool
        ready = self._joining.get(url, False)
        try:
            state = await pool.add(WorkerSpec(url, self.version, warm=not ready))
        except WorkerRefused as err:  # another model or tokenizer: never tried again
            self._refused.add(url)
            log.error("scaler_join_refused", model=self.model, url=url, error=str(err))
            member = self._owned.get(url)
            if member is not None and not self.advisory:
                self._spawn(self._stop_member(member, url), f"scaler-stop-{member}")
            return
        except Exception as err:  # unreachable, malformed: logged, tried again next sync
            log.warning("scaler_join_failed", model=self.model, url=url, error=str(err))
            return
        finally:
            self._joining.pop(url, None)
        if not ready:
            self._warm.add(state.worker_id)
        log.info("scaler_joined", model=self.model, worker=state.worker_id, url=url, warm=not ready)

    # -- signals --

    def _prune_warm(self) -> None:
        """Forget warm ids no longer cordoned by us (left, uncordoned or moved by someone
        else), so an operator's cordon is never taken for a warm replica."""
        pool = self.dispatch.pool
        self._warm = {
            i for i in self._warm if pool.has(i) and pool.state(i).phase is Phase.CORDONED
        }

    def counts(self) -> ReplicaCounts:
        """The pool's replicas by state now (`ReplicaCounts`)."""
        self._prune_warm()
        workers = self.dispatch.pool.workers()
        in_pool = {w.url for w in workers}
        skip = self._retiring | self._refused
        starting = sum(
            1
            for m in self.actuator.members()
            if m.url not in skip
            and (
                m.state is MemberState.STARTING
                or (m.state is MemberState.READY and m.url is not None and m.url not in in_pool)
            )
        )
        starting += sum(1 for w in workers if w.phase is Phase.JOINING)
        return ReplicaCounts(
            ready=sum(1 for w in workers if w.phase is Phase.READY and w.healthy),
            warm=sum(1 for w in workers if w.worker_id in self._warm),
            starting=starting,
            draining=sum(1 for w in workers if w.phase is Phase.DRAINING),
            ejected=sum(1 for w in workers if w.phase is Phase.EJECTED),
        )

    def signals(self) -> PoolSignals:
        """This tick's `PoolSignals`; feeds the capacity estimator first. `starting` leaves
        out the replicas starting for the warm pool (they will not take requests)."""
        now = self.clock.now()
        workers = self.dispatch.pool.workers()
        ready = [w for w in workers if w.phase is Phase.READY and w.healthy]
        samples = []
        for w in ready:
            snap = self.snapshot(w, SAMPLE_WINDOW_S)
            running = float(w.load.running) if w.load is not None else float(w.in_flight_all)
            samples.append(
                ReplicaSample(
                    running=running,
                    tpot_s=snap.tpot_s,
                    prefill_tokens_per_s=(snap.uncached_tokens or 0) / SAMPLE_WINDOW_S,
                    ttft_per_uncached_token_s=snap.ttft_per_uncached_token_s,
                )
            )
        self.estimator.observe(samples)
        demand = self.demand.snapshot()
        counts = self.counts()
        warm_share = max(0, (self.last.desired_warm if self.last else 0) - counts.warm)
        warm_share = min(warm_share, counts.starting)
        serving = [w for w in workers if w.phase is not Phase.JOINING]
        return PoolSignals(
            now=now,
            ready=counts.ready,
            warm=counts.warm,
            starting=counts.starting - warm_share,
            draining=counts.draining,
            in_flight=sum(w.in_flight_all for w in serving),
            queued=self.dispatch.queued,
            prefill_tokens_per_s=demand.prefill_tokens_per_s,
            arrivals_per_s=demand.arrivals_per_s,
            last_arrival_at=demand.last_arrival_at,
            ttft_p95_s=demand.ttft_p95_s,
            ttft_slo_s=self.ttft_slo_s,
            burn_rate=self.burn_rate(),
            workers_waiting=sum(1 for w in ready if w.load is not None and w.load.waiting > 0),
            cold_start_s=self.actuator.cold_start_s(),
            decode_streams_per_replica=self.estimator.decode_streams,
            prefill_tokens_per_s_per_replica=self.estimator.prefill_tokens_per_s,
            warm_starting=warm_share,
        )

    # -- acting --

    async def apply(self, d: Decision) -> None:
        """Move the pool toward `d` (module docstring); nothing in advisory mode. The
        promotions, demotions and drains happen in one step, before the only await (the
        actuator's start)."""
        if self.advisory or self._closed or not self.elector.is_leader:
            return
        pool = self.dispatch.pool
        counts = self.counts()
        workers = pool.workers()
        warm = [w for w in workers if w.worker_id in self._warm]
        need = d.desired_ready - counts.ready
        warm_left = len(warm)
        if need > 0:
            for w in warm[:need]:  # promote: ready at once
                with contextlib.suppress(IllegalTransition, KeyError):
                    pool.uncordon(w.worker_id)
                    self._warm.discard(w.worker_id)
                    log.info("scaler_promoted", model=self.model, worker=w.worker_id)
                    need -= 1
                    warm_left -= 1
        elif need < 0:
            for v in self._victims(workers, -need):
                if warm_left < d.desired_warm and v.phase == Phase.READY.value:
                    with contextlib.suppress(IllegalTransition, KeyError):
                        pool.cordon(v.worker_id)  # kept, idle, as a warm replica
                        self._warm.add(v.worker_id)
                        warm_left += 1
                        log.info("scaler_to_warm", model=self.model, worker=v.worker_id)
                        continue
                self._drain(v.worker_id, reason="scale_down")
        extra_warm = warm_left - d.desired_warm
        if extra_warm > 0 and need <= 0:
            idle = sorted(
                (w for w in warm if w.worker_id in self._warm), key=lambda w: w.in_flight_all
            )
            for w in idle[:extra_warm]:
                self._warm.discard(w.worker_id)
                self._drain(w.worker_id, reason="warm_surplus")
        wanted = max(0, need) + max(0, d.desired_warm - warm_left)
        more = wanted - counts.starting
        if more > 0 and await self._fenced("start"):
            try:
                await self.actuator.start(more)
            except ActuatorError as err:
                log.warning("scaler_start_refused", model=self.model, count=more, error=str(err))
            else:
                log.info("scaler_asked", model=self.model, count=more)

    def _victims(self, workers: Sequence[WorkerState], count: int) -> list[VictimCandidate]:
        """The `count` cheapest of our own ready or ejected workers to remove."""
        ours = [
            w
            for w in workers
            if w.url in self._owned
            and w.url not in self._retiring
            and w.phase in (Phase.READY, Phase.EJECTED)
        ]
        if not ours:
            return []
        values = self.dispatch.router.cache_values([w.worker_id for w in ours])
        candidates = [
            VictimCandidate(
                worker_id=w.worker_id,
                in_flight=w.in_flight_all,
                unique_blocks=values[w.worker_id].unique_blocks,
                unique_recent_blocks=values[w.worker_id].unique_recent_blocks,
                phase=w.phase.value,
            )
            for w in ours
        ]
        return choose_victims(candidates, count)

    async def _fenced(self, action: str) -> bool:
        """Whether this instance still leads by the store's own word (the fencing check
        before an actuator call); a deposed leader's call is dropped and logged."""
        token = self.elector.token
        if token is not None and await self.elector.still_leader(token):
            return True
        log.warning("scaler_not_leader", model=self.model, action=action, token=token)
        return False

    def _drain(self, worker_id: str, *, reason: str) -> None:
        try:
            state = self.fleet.drain(worker_id, self.drain_timeout_s)
        except FleetError as err:
            log.warning("scaler_drain_refused", model=self.model, worker=worker_id, error=str(err))
            return
        self._retiring.add(state.url)
        log.info(
            "scaler_draining",
            model=self.model,
            worker=worker_id,
            reason=reason,
            in_flight=state.in_flight_all,
        )
        self._spawn(self._stop_when_gone(worker_id, state.url), f"scaler-stop-{worker_id}")

    async def _stop_when_gone(self, worker_id: str, url: str) -> None:
        await self.dispatch.pool.wait_gone(worker_id)
        self._warm.discard(worker_id)
        member = self._owned.get(url)
        if member is None:
            self._retiring.discard(url)
            return
        await self._stop_member(member, url)
        log.info("scaler_stopped", model=self.model, worker=worker_id, member=member)

    async def _stop_member(self, member: str, url: str) -> None:
        """Stop `member`; its URL stays retired (never joined again) until the actuator no
        longer lists it."""
        self._retiring.add(url)
        try:
            if self.advisory or not await self._fenced("stop"):
                return  # advisory acts on nothing; else another instance leads and stops
            try:
                await self.actuator.stop(member)
            except ActuatorError as err:  # still listed: stays retired, never joined again
                log.warning("scaler_stop_failed", model=self.model, member=member, error=str(err))
        finally:
            if not any(m.url == url for m in self.actuator.members()):
                self._retiring.discard(url)  # its address may serve a new member
                self._owned.pop(url, None)

    def _spawn(self, coro: object, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reporting --

    def advise(self) -> tuple[PoolSignals, Decision]:
        """What a tick would decide now, from this moment's signals, without acting and
        without moving the policy's history or the capacity estimate."""
        estimator = self.estimator
        self.estimator = copy.deepcopy(estimator)
        try:
            signals = self.signals()
        finally:
            self.estimator = estimator
        return signals, copy.deepcopy(self.policy).decide(signals)

    @property
    def mode(self) -> str:
        """ "advisory", "active" (this instance actuates), "follower" (another does) or
        "lease-unreachable" (not leading, and the lease store cannot be reached: whether any
        instance actuates is unknown here)."""
        if self.advisory:
            return "advisory"
        if self.elector.is_leader:
            return "active"
        return "lease-unreachable" if self.elector.store_error is not None else "follower"

    def report(self, s: PoolSignals, d: Decision) -> None:
        """Log and export one decision."""
        self.last_signals = s
        mode = self.mode
        log.info(
            "scaler_decision",
            model=self.model,
            mode=mode,
            reason=d.reason,
            fast=d.fast,
            held_by=d.held_by,
            desired_ready=d.desired_ready,
            desired_warm=d.desired_warm,
            ready=s.ready,
            warm=s.warm,
            starting=s.starting,
            draining=s.draining,
            in_flight=s.in_flight,
            queued=s.queued,
            # the leading indicators' inputs, so a fast path can be told apart afterwards
            workers_waiting=s.workers_waiting,
            ttft_p95_s=s.ttft_p95_s,
            burn_rate=s.burn_rate,
            chain={k: round(v, 4) for k, v in d.chain.steps()},
        )
        m = self.metrics
        if m is None:
            return
        model = self.model
        m.desired.labels(model, "ready").set(d.desired_ready)
        m.desired.labels(model, "warm").set(d.desired_warm)
        for state, n in (
            ("ready", s.ready),
            ("warm", s.warm),
            ("starting", s.starting),
            ("draining", s.draining),
        ):
            m.replicas.labels(model, state).set(n)
        m.decisions.labels(model, d.reason, mode).inc()
        cold = self.actuator.cold_start_s()
        if cold is not None:  # no series before the first measurement (never NaN)
            m.cold_start.labels(model).set(cold)
        m.capacity.labels(model, "decode_streams").set(s.decode_streams_per_replica)
        m.capacity.labels(model, "prefill_tokens_per_s").set(s.prefill_tokens_per_s_per_replica)
        m.demand.labels(model, "streams").set(s.in_flight + s.queued)
        m.demand.labels(model, "prefill_tokens_per_s").set(s.prefill_tokens_per_s)
        m.demand.labels(model, "arrivals_per_s").set(s.arrivals_per_s)
        failed = self.actuator.failed_starts
        if failed > self._failed_seen:
            m.failed_starts.labels(model).inc(failed - self._failed_seen)
            self._failed_seen = failed

    async def close(self) -> None:
        """Stop following the actuator and end the scaler's own tasks (whoever built the
        actuator closes it)."""
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Scaler:
    """Every pool's autoscaler on one tick; `gpu_budget`: GPUs all pools may hold together
    (None: no limit)."""

    pools: list[PoolScaler]
    clock: Clock
    tick_s: float = 5.0
    gpu_budget: int | None = None
    _woken: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def wake(self) -> None:
        """Tick now rather than at the next `tick_s` (a request waits at zero replicas)."""
        self._woken.set()

    def start(self) -> None:
        """Follow each pool's actuator."""
        for p in self.pools:
            p.start()

    async def run(self) -> None:
        """`step` every `tick_s`, or at once when woken, until cancelled; a failed step is
        logged, not fatal."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with self.clock.timeout(self.tick_s):
                    await self._woken.wait()
            self._woken.clear()
            try:
                await self.step()
            except Exception:
                log.exception("scaler_step_failed")

    async def step(self) -> dict[str, Decision]:
        """One tick: signals, decisions, the budget, then every pool's apply at once (one
        pool's failure or slow actuator holds up no other). Returns the decisions applied
        (or reported, in advisory mode) by model."""
        signals: dict[str, PoolSignals] = {}
        wants: dict[str, Decision] = {}
        pools: list[PoolScaler] = []
        for p in self.pools:
            try:
                p.sync_members()  # a join that failed is tried again
                signals[p.model] = p.signals()
                wants[p.model] = p.policy.decide(signals[p.model])
            except Exception:
                log.exception("scaler_decide_failed", model=p.model)
                continue
            pools.append(p)
        # GPUs held now: draining and ejected replicas hold theirs too.
        current = {}
        for p in pools:
            s, c = signals[p.model], p.counts()
            current[p.model] = s.ready + s.warm + c.starting + c.draining + c.ejected
        gpus = {p.model: p.config.gpus_per_replica for p in pools}
        floors = {p.model: int(wants[p.model].chain.floor) for p in pools}
        decisions = apportion(wants, current, gpus, self.gpu_budget, min_ready=floors)
        for p in pools:
            p.last = decisions[p.model]
            p.report(signals[p.model], decisions[p.model])
        results = await asyncio.gather(
            *(p.apply(decisions[p.model]) for p in pools), return_exceptions=True
        )
        for p, result in zip(pools, results, strict=True):
            if isinstance(result, Exception):
                log.error("scaler_apply_failed", model=p.model, error=repr(result))
        return decisions

    async def close(self) -> None:
        """Close every pool's scaler."""
        await asyncio.gather(*(p.close() for p in self.pools), return_exceptions=True)
