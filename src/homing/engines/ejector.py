"""The outlier-ejection loop of one pool: reads snapshots, applies the detector's plan
through the pool's lifecycle, and sends the readmission probes.

Rule of this file: the I/O shell around `homing.engines.outliers.OutlierDetector`. Every
`interval_s` (on the injected clock) `step` takes one snapshot per worker, asks the
detector for a plan and applies its readmissions and ejections at once (no await between
the snapshot and `WorkerPool.eject` / `readmit`, so the plan matches the pool), then runs
the probes: the same short generation (`PROBE_PROMPT`, greedy, `PROBE_TOKENS` new tokens,
through the worker's `EngineClient.generate`, counted in flight by `WorkerPool.track`) on
the ejected worker and on one ready peer at once; their TPOTs go back to the detector.
Between intervals it watches the pool (`WorkerPool.subscribe`): once no worker is ready
while one is ejected (the others died after its ejection), it readmits the ejected ones at
once (`OutlierDetector.rescue`), from a task of its own, not inside the pool's change. Each
ejection, return, skip and probe is a metric (`homing.engines.metrics`) and a structlog
line (`outlier_ejected`, `outlier_returned`, `outlier_kept`, `outlier_probe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence

import structlog

from homing.clock import Clock
from homing.engines.client import EngineError, GenerateDone, GenerateParams, TokenChunk
from homing.engines.lifecycle import IllegalTransition, Phase
from homing.engines.metrics import EngineMetrics, OutlierFamily
from homing.engines.outliers import (
    OutlierConfig,
    OutlierDetector,
    Plan,
    Probe,
    ProbeResult,
    WorkerSignals,
)
from homing.engines.pool import WorkerPool

log = structlog.get_logger("homing.outliers")

#: The probe's prompt: 32 fixed token ids (two 16-token KV pages), the same for the worker
#: and its peer so their timings compare; ids below 1000 are left alone (special tokens).
PROBE_PROMPT: tuple[int, ...] = tuple(range(1000, 1032))
#: New tokens a probe asks for (greedy, EOS ignored): 7 intervals to time TPOT over.
PROBE_TOKENS = 8


class OutlierEjector:
    """Outlier ejection for `pool` (model name `model`, for metrics and logs).

    `snapshots`: one `WorkerSignals` per worker of the pool now (e.g. the request
    recorder's `ReplicaStats.snapshot` over `config.window_s`). `metrics`: None counts
    nothing. Run `run()` as a task (`WorkerPool.run_beside`); `step()` is one interval.
    """

    def __init__(
        self,
        pool: WorkerPool,
        *,
        model: str,
        snapshots: Callable[[], Sequence[WorkerSignals]],
        config: OutlierConfig,
        clock: Clock,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.pool = pool
        self.model = model
        self.config = config
        self.detector = OutlierDetector(config, now=clock.now)
        self._snapshots = snapshots
        self._clock = clock
        self._metrics = metrics
        self._probe_ids = itertools.count()
        self._known: set[str] = set()

    async def run(self) -> None:
        """`step` every `interval_s` until cancelled, and `rescue` whenever the pool
        changes in between; a failed step is logged, not fatal."""
        changed = asyncio.Event()
        unsubscribe = self.pool.subscribe(changed.set)
        watcher = asyncio.create_task(self._watch(changed), name=f"outliers-rescue-{self.model}")
        try:
            while True:
                await self._clock.sleep(self.config.interval_s)
                try:
                    await self.step()
                except Exception:
                    log.exception("outlier_step_failed", model=self.model)
        finally:
            unsubscribe()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self, changed: asyncio.Event) -> None:
        while True:
            await changed.wait()
            changed.clear()
            try:
                self.rescue()
            except Exception:
                log.exception("outlier_rescue_failed", model=self.model)

    def rescue(self) -> list[str]:
        """Readmit every ejected worker now if no worker of the pool is ready (the
        detector's `rescue`); the ids readmitted."""
        if not self.detector.ejected():
            return []
        readmits = self.detector.rescue(list(self._snapshots()))
        for r in readmits:
            self._readmit(r.worker_id, r.reason)
        return [r.worker_id for r in readmits]

    async def step(self) -> Plan:
        """One interval: evaluate, apply, probe. Returns the plan it applied."""
        signals = list(self._snapshots())
        self._forget_gone({s.worker_id for s in signals})
        plan = self.detector.evaluate(signals)
        for r in plan.readmissions:
            self._readmit(r.worker_id, r.reason)
        for e in plan.ejections:
            try:
                self.pool.eject(e.worker_id)
            except (KeyError, IllegalTransition) as err:  # cannot happen without an await
                log.warning("outlier_eject_failed", worker=e.worker_id, error=str(err))
                self.detector.forget(e.worker_id)
                continue
            self._count("ejections", e.worker_id, e.reason)
            log.info(
                "outlier_ejected",
                model=self.model,
                worker=e.worker_id,
                reason=e.reason,
                value=round(e.value, 6),
                baseline=round(e.baseline, 6),
                factor=self.config.factor,
                ejection_s=e.duration_s,
                times=e.times,
            )
        for k in plan.skips:
            self._count("skipped", k.worker_id, k.why)
            log.info(
                "outlier_kept", model=self.model, worker=k.worker_id, reason=k.reason, why=k.why
            )
        if plan.probes:
            await asyncio.gather(*(self._probe_and_judge(p) for p in plan.probes))
        return plan

    async def _probe_and_judge(self, probe: Probe) -> None:
        peer_probe = self.probe(probe.peer_id) if probe.peer_id is not None else None
        if peer_probe is not None:
            worker, peer = await asyncio.gather(self.probe(probe.worker_id), peer_probe)
        else:
            worker, peer = await self.probe(probe.worker_id), None
        state = self.pool.state(probe.worker_id) if self.pool.has(probe.worker_id) else None
        if state is None or state.phase is not Phase.EJECTED:
            return  # drained or removed meanwhile: the next evaluation forgets it
        readmit = self.detector.probed(probe.worker_id, worker, peer)
        result = "readmitted" if readmit else ("slow" if worker.ok else "failed")
        self._count_probe(probe.worker_id, result)
        log.info(
            "outlier_probe",
            model=self.model,
            worker=probe.worker_id,
            peer=probe.peer_id,
            result=result,
            tpot_s=worker.tpot_s,
            peer_tpot_s=peer.tpot_s if peer is not None else None,
            error=worker.error,
        )
        if readmit:
            self._readmit(probe.worker_id, "probe")

    async def probe(self, worker_id: str) -> ProbeResult:
        """One probe generation on `worker_id`: ok with its TPOT (seconds per token after
        the first, timed on the clock) when it completed within `probe_timeout_s`."""
        if not self.pool.has(worker_id):
            return ProbeResult(False, error="worker left the pool")
        params = GenerateParams(
            request_id=f"homing-probe-{self.model}-{worker_id}-{next(self._probe_ids)}",
            input_ids=PROBE_PROMPT,
            max_new_tokens=PROBE_TOKENS,
            temperature=0.0,
            ignore_eos=True,
        )
        timeout_s = self.config.probe_timeout_s
        first_at: float | None = None
        last_at = 0.0
        tokens = 0
        first_tokens = 0
        try:
            with self.pool.track(worker_id):
                stream = self.pool.client(worker_id).generate(params, timeout_s=timeout_s)
                async with contextlib.aclosing(stream), self._clock.timeout(timeout_s):
                    async for item in stream:
                        now = self._clock.now()
                        added = (
                            len(item.token_ids)
                            if isinstance(item, TokenChunk)
                            else len(item.new_tokens(tokens))
                        )
                        if added:
                            tokens += added
                            if first_at is None:
                                first_at, first_tokens = now, added
                            last_at = now
                        if isinstance(item, GenerateDone):
                            break
        except EngineError as err:
            return ProbeResult(False, error=str(err))
        except TimeoutError:
            return ProbeResult(False, error=f"no answer within {timeout_s:g} s")
        if tokens == 0 or first_at is None:
            return ProbeResult(False, error="the probe generated no token")
        after_first = tokens - first_tokens
        tpot = (last_at - first_at) / after_first if after_first > 0 else None
        return ProbeResult(True, tpot_s=tpot)

    def _readmit(self, worker_id: str, reason: str) -> None:
        try:
            self.pool.readmit(worker_id)
        except (KeyError, IllegalTransition) as err:
            log.warning("outlier_readmit_failed", worker=worker_id, error=str(err))
            self.detector.forget(worker_id)
            return
        self._count("returns", worker_id, reason)
        log.info("outlier_returned", model=self.model, worker=worker_id, reason=reason)

    def _count(self, family: OutlierFamily, worker_id: str, label: str) -> None:
        self._known.add(worker_id)
        if self._metrics is not None:
            self._metrics.inc(self._metrics.outliers[family], self.model, worker_id, label)

    def _count_probe(self, worker_id: str, result: str) -> None:
        self._count("probes", worker_id, result)

    def _forget_gone(self, present: set[str]) -> None:
        """Workers that left the pool leave no labelled series."""
        for worker_id in self._known - present:
            self._known.discard(worker_id)
            if self._metrics is not None:
                self._metrics.forget(self.model, worker_id)
