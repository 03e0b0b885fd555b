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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from homing.clock import Clock
from homing.engines.lifecycle import IllegalTransition, Phase
from homing.engines.pool import WorkerSpec, WorkerState
from homing.fleet import Fleet, ModelDispatch
from homing.fleet.fleet import FleetError
from homing.obs.demand import DemandMeter
from homing.obs.replica import ReplicaSnapshot
from homing.scaler.actuators.base import Actuator, ActuatorError, MemberState
from homing.scaler.budget import apportion
from homing.scaler.capacity import CapacityEstimator, ReplicaSample
from homing.scaler.metrics import ScalerMetrics
from homing.scaler.policy import Decision, PoolSignals, ScalerConfig, ScalingPolicy
from homing.scaler.victim import VictimCandidate, choose_victims

log = structlog.get_logger("homing.scaler")

#: Seconds of replica records a tick's capacity samples summarise (the snapshots' window).
SAMPLE_WINDOW_S = 15.0


@dataclass
class PoolScaler:
    """The autoscaler of one model's pool.

    `dispatch`: the model. `fleet`: drains go through it. `actuator`: starts and stops its
    replicas. `demand`: the model's meter. `snapshot`: a worker's replica snapshot over a
    window (seconds). `burn_rate`: the SLO's fast-window burn rate (None: no SLO data).
    `ttft_slo_s`: the SLO's TTFT target. `advisory`: decide and report, never act.
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
    policy: ScalingPolicy = field(init=False)
    last: Decision | None = field(default=None, init=False)
    _warm: set[str] = field(default_factory=set, init=False)  # worker ids kept warm
    _owned: dict[str, str] = field(default_factory=dict, init=False)  # url -> member id
    _joining: set[str] = field(default_factory=set, init=False)  # urls being added
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    _unsubscribe: Callable[[], None] | None = field(default=None, init=False)
    _failed_seen: int = field(default=0, init=False)

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
        if self.advisory:
            return
        pool = self.dispatch.pool
        in_pool = {w.url: w for w in pool.workers()}
        live_urls: set[str] = set()
        for m in self.actuator.members():
            if m.url is None:
                continue
            live_urls.add(m.url)
            self._owned[m.url] = m.member_id
            if m.state is MemberState.READY and m.url not in in_pool and m.url not in self._joining:
                self._joining.add(m.url)
                self._spawn(self._join(m.url), f"scaler-join-{self.model}")
        for url, w in in_pool.items():  # its member is gone (died, deleted): let it go
            if url in self._owned and url not in live_urls and w.phase is not Phase.DRAINING:
                self._owned.pop(url, None)
                self._warm.discard(w.worker_id)
                self._drain(w.worker_id, reason="member_gone")

    async def _join(self, url: str) -> None:
        pool = self.dispatch.pool
        want = self.last.desired_ready if self.last is not None else 0
        ready = sum(1 for w in pool.workers() if w.phase is Phase.READY)
        warm = ready >= want
        try:
            state = await pool.add(WorkerSpec(url, self.version, warm=warm))
        except Exception as err:  # refused, unreachable, malformed: logged, retried next sync
            log.warning("scaler_join_failed", model=self.model, url=url, error=str(err))
            return
        finally:
            self._joining.discard(url)
        if warm:
            self._warm.add(state.worker_id)
        log.info("scaler_joined", model=self.model, worker=state.worker_id, url=url, warm=warm)

    # -- signals --

    def counts(self) -> dict[str, int]:
        """Replicas by state: ready, warm, starting (asked for or joining), draining."""
        workers = self.dispatch.pool.workers()
        in_pool = {w.url for w in workers}
        starting = sum(
            1
            for m in self.actuator.members()
            if m.state is MemberState.STARTING or (m.url is not None and m.url not in in_pool)
        )
        starting += sum(1 for w in workers if w.phase is Phase.JOINING)
        return {
            "ready": sum(1 for w in workers if w.phase is Phase.READY),
            "warm": sum(
                1 for w in workers if w.worker_id in self._warm and w.phase is Phase.CORDONED
            ),
            "starting": starting,
            "draining": sum(1 for w in workers if w.phase is Phase.DRAINING),
        }

    def signals(self) -> PoolSignals:
        """This tick's `PoolSignals`; feeds the capacity estimator first."""
        now = self.clock.now()
        workers = self.dispatch.pool.workers()
        ready = [w for w in workers if w.phase is Phase.READY]
        samples = []
        for w in ready:
            snap = self.snapshot(w, SAMPLE_WINDOW_S)
            running = float(w.load.running) if w.load is not None else float(w.in_flight)
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
        return PoolSignals(
            now=now,
            ready=counts["ready"],
            warm=counts["warm"],
            starting=counts["starting"],
            draining=counts["draining"],
            in_flight=sum(w.in_flight for w in ready),
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
        )

    # -- acting --

    async def apply(self, d: Decision) -> None:
        """Move the pool toward `d` (module docstring); nothing in advisory mode."""
        if self.advisory:
            return
        pool = self.dispatch.pool
        workers = pool.workers()
        ready = [w for w in workers if w.phase is Phase.READY]
        warm = [w for w in workers if w.worker_id in self._warm and w.phase is Phase.CORDONED]
        counts = self.counts()
        need = d.desired_ready - len(ready)
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
            victims = self._victims(ready, -need)
            for v in victims:
                if warm_left < d.desired_warm:  # keep it, idle, as a warm replica
                    with contextlib.suppress(IllegalTransition, KeyError):
                        pool.cordon(v.worker_id)
                        self._warm.add(v.worker_id)
                        warm_left += 1
                        log.info("scaler_to_warm", model=self.model, worker=v.worker_id)
                        continue
                self._drain(v.worker_id, reason="scale_down")
        wanted = max(0, need) + max(0, d.desired_warm - warm_left)
        more = wanted - counts["starting"]
        if more > 0:
            try:
                await self.actuator.start(more)
            except ActuatorError as err:
                log.warning("scaler_start_refused", model=self.model, count=more, error=str(err))
            else:
                log.info("scaler_asked", model=self.model, count=more)
        extra_warm = warm_left - d.desired_warm
        if extra_warm > 0 and need <= 0:
            idle = [w for w in warm if w.worker_id in self._warm][:extra_warm]
            for w in idle:
                self._warm.discard(w.worker_id)
                self._drain(w.worker_id, reason="warm_surplus")

    def _victims(self, ready: Sequence[WorkerState], count: int) -> list[VictimCandidate]:
        router = self.dispatch.router
        candidates = []
        for w in ready:
            if w.url not in self._owned:
                continue  # not ours to stop
            value = router.cache_value(w.worker_id)
            candidates.append(
                VictimCandidate(
                    worker_id=w.worker_id,
                    in_flight=w.in_flight,
                    unique_blocks=value.unique_blocks,
                    unique_recent_blocks=value.unique_recent_blocks,
                    phase=w.phase.value,
                )
            )
        return choose_victims(candidates, count)

    def _drain(self, worker_id: str, *, reason: str) -> None:
        try:
            state = self.fleet.drain(worker_id, self.drain_timeout_s)
        except FleetError as err:
            log.warning("scaler_drain_refused", model=self.model, worker=worker_id, error=str(err))
            return
        log.info(
            "scaler_draining",
            model=self.model,
            worker=worker_id,
            reason=reason,
            in_flight=state.in_flight,
        )
        self._spawn(self._stop_when_gone(worker_id, state.url), f"scaler-stop-{worker_id}")

    async def _stop_when_gone(self, worker_id: str, url: str) -> None:
        await self.dispatch.pool.wait_gone(worker_id)
        member = self._owned.pop(url, None)
        self._warm.discard(worker_id)
        if member is None:
            return
        try:
            await self.actuator.stop(member)
        except ActuatorError as err:
            log.warning("scaler_stop_failed", model=self.model, member=member, error=str(err))
            return
        log.info("scaler_stopped", model=self.model, worker=worker_id, member=member)

    def _spawn(self, coro: object, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reporting --

    def report(self, s: PoolSignals, d: Decision) -> None:
        """Log and export one decision."""
        mode = "advisory" if self.advisory else "active"
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
            chain={k: round(v, 4) for k, v in d.chain.items()},
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
        m.cold_start.labels(model).set(float("nan") if cold is None else cold)
        m.capacity.labels(model, "decode_streams").set(s.decode_streams_per_replica)
        m.capacity.labels(model, "prefill_tokens_per_s").set(s.prefill_tokens_per_s_per_replica)
        m.demand.labels(model, "streams").set(s.in_flight + s.queued)
        m.demand.labels(model, "prefill_tokens_per_s").set(s.prefill_tokens_per_s)
        m.demand.labels(model, "arrivals_per_s").set(s.arrivals_per_s)
        failed = getattr(self.actuator, "failed_starts", 0)
        if failed > self._failed_seen:
            m.failed_starts.labels(model).inc(failed - self._failed_seen)
            self._failed_seen = failed

    async def close(self) -> None:
        """Stop following the actuator and end the scaler's own tasks (whoever built the
        actuator closes it)."""
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

    def start(self) -> None:
        """Follow each pool's actuator."""
        for p in self.pools:
            p.start()

    async def run(self) -> None:
        """`step` every `tick_s` until cancelled; a failed step is logged, not fatal."""
        while True:
            await self.clock.sleep(self.tick_s)
            try:
                await self.step()
            except Exception:
                log.exception("scaler_step_failed")

    async def step(self) -> dict[str, Decision]:
        """One tick: signals, decisions, the budget, then each pool's apply. Returns the
        decisions applied (or reported, in advisory mode) by model."""
        for p in self.pools:
            p.sync_members()  # a join that failed is tried again
        signals = {p.model: p.signals() for p in self.pools}
        wants = {p.model: p.policy.decide(signals[p.model]) for p in self.pools}
        current = {m: s.ready + s.warm + s.starting for m, s in signals.items()}
        gpus = {p.model: p.config.gpus_per_replica for p in self.pools}
        floors = {p.model: p.config.min_replicas for p in self.pools}
        decisions = apportion(wants, current, gpus, self.gpu_budget, min_ready=floors)
        for p in self.pools:
            d = decisions[p.model]
            p.last = d
            p.report(signals[p.model], d)
            await p.apply(d)
        return decisions

    async def close(self) -> None:
        """Close every pool's scaler."""
        await asyncio.gather(*(p.close() for p in self.pools), return_exceptions=True)
