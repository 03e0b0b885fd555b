"""Health: each worker's probe loop and the health changes of the pool's workers.

Every `health_interval_s` a worker gets a `HealthCheck` with `health_timeout_s`;
consecutive outcomes flip health (`unhealthy_threshold` failures, `healthy_threshold`
successes). Requests' transport errors and a KV stream's connection failures count as
failures too (the pool and `KvLoop` feed them to `HealthLoop.observe`). A worker not yet
discovered is discovered by its first successful probe, and joins then.

Health is judged by progress too (`homing.engines.health.probe_verdict`): a probe that times
out on a worker that is busy and whose KV-event stream shows engine work within
`progress_window_s` counts neither way (`WorkerState.probes_excused` counts them); a busy
worker whose load records stopped arriving or changing gets its timeouts counted.

A worker that stops answering (a counted probe failure leaves it unhealthy while its
KV-event stream shows no engine work within `progress_window_s`: a frozen process whose TCP
connection stays open; a probe timeout with streams open and no progress within that window
turns it unhealthy at once, `homing.engines.health.stalled`) has its open Generate streams
cut at once (`EngineClient.sever`):
each consumer gets `EngineError(UNAVAILABLE, transport)` within one probe, rather than after
the channel's keepalive (~50 s), and can retry or migrate. A worker that answers its probes
"unhealthy" while it still visibly decodes keeps its streams (it only leaves rotation).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from homing.clock import Clock
from homing.engines.health import (
    HealthStatus,
    HealthThresholds,
    LoadSample,
    ProbeOutcome,
    is_busy,
    observe,
    probe_verdict,
    stalled,
)
from homing.engines.pool.discovery import Discovered, fetch_discovery
from homing.engines.pool.state import PoolConfig, Worker, WorkerRefused, WorkerState

log = structlog.get_logger(__name__)


def _outcome(healthy: bool, timed_out: bool) -> ProbeOutcome:
    """A HealthCheck's `ProbeOutcome`: answered healthy, out of time, or else failed."""
    if healthy:
        return ProbeOutcome.OK
    return ProbeOutcome.TIMED_OUT if timed_out else ProbeOutcome.FAILED


class HealthLoop:
    """The health job of one pool: `run` probes one worker for its life; `observe`,
    `change` and `set_status` put health outcomes in force (each change is reported:
    `notify()`, and `on_change(state)` when the worker turns healthy or unhealthy).

    From the pool it takes `join(w, discovered)`, which accepts a worker its probe
    discovered (raising `WorkerRefused` for one that does not belong), and `refuse(w)`,
    which retires a refused worker.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        config: PoolConfig,
        notify: Callable[[], None],
        on_change: Callable[[WorkerState], None] | None,
        join: Callable[[Worker, Discovered], None],
        refuse: Callable[[Worker], None],
    ) -> None:
        self._clock = clock
        self._config = config
        self._thresholds = HealthThresholds(
            unhealthy_threshold=config.unhealthy_threshold,
            healthy_threshold=config.healthy_threshold,
        )
        self._notify = notify
        self._on_change = on_change
        self._join = join
        self._refuse = refuse

    async def run(self, w: Worker) -> None:
        """Probe `w` every `health_interval_s` until cancelled (or until it is refused)."""
        cfg = self._config
        while True:
            await self._clock.sleep(cfg.health_interval_s)
            probe = await w.client.health_probe(timeout_s=cfg.health_timeout_s)
            ok = probe.healthy
            if not ok and w.state.discovered:
                verdict = self._probe_verdict(w, _outcome(ok, probe.timed_out))
                if verdict is None:
                    w.state.probes_excused += 1
                    log.debug("probe_excused", worker=w.state.worker_id, url=w.state.url)
                    continue
            if not ok:
                w.state.last_error = (
                    "health check timed out" if probe.timed_out else "health check failed"
                )
            elif not w.state.discovered:
                result = await fetch_discovery(w, cfg)
                if result is None:
                    ok = False
                else:
                    try:
                        self._join(w, result)
                    except WorkerRefused:
                        self._refuse(w)
                        return
                    continue  # joined (healthy) by the discovery itself
            self.observe(w, ok, "probe")
            if not ok and w.state.healthy and self._stalled(w, probe.timed_out):
                after = HealthStatus(False, w.state.consecutive_failures, 0)
                self.change(w, after, "stalled")
            if not ok and not w.state.healthy:
                self._sever(w)

    # ------------------------------------------------------------------ state changes

    def observe(self, w: Worker, ok: bool, source: str) -> None:
        """One more outcome for `w` (`ok`: a success) from `source` ("probe", "request",
        "kv_stream"); a worker not yet discovered does not turn healthy."""
        s = w.state
        before = HealthStatus(s.healthy, s.consecutive_failures, s.consecutive_successes)
        after = observe(before, ok, self._thresholds)
        if after.healthy and not s.discovered:
            after = HealthStatus(False, after.consecutive_failures, after.consecutive_successes)
        self.change(w, after, source)

    def change(self, w: Worker, after: HealthStatus, source: str) -> None:
        """Put `after` in force for `w`, logging a flip with its `source`."""
        s = w.state
        was_healthy = s.healthy
        self.set_status(w, after)
        if after.healthy != was_healthy:
            log.info(
                "worker_health_changed",
                worker=s.worker_id,
                url=s.url,
                healthy=after.healthy,
                source=source,
                error=None if after.healthy else s.last_error,
            )

    def set_status(self, w: Worker, status: HealthStatus) -> None:
        """Put `status` in force for `w` (unlogged); a worker turning healthy cuts its KV
        stream's backoff short."""
        flipped = w.state.healthy != status.healthy
        w.state.healthy = status.healthy
        w.state.consecutive_failures = status.consecutive_failures
        w.state.consecutive_successes = status.consecutive_successes
        self._notify()
        if flipped and status.healthy:
            w.kv_retry.set()
        if flipped and self._on_change is not None:
            self._on_change(w.state)

    # ------------------------------------------------------------------ verdicts

    def _stalled(self, w: Worker, timed_out: bool) -> bool:
        """`homing.engines.health.stalled` for `w`'s probe that just failed."""
        return stalled(
            ProbeOutcome.TIMED_OUT if timed_out else ProbeOutcome.FAILED,
            open_streams=w.client.open_streams,
            last_progress_at=w.state.last_progress_at,
            now=self._clock.now(),
            window_s=self._config.progress_window_s,
        )

    def _sever(self, w: Worker) -> None:
        """`w` failed a counted probe and is unhealthy: cut its open Generate streams
        (module docstring), unless its KV-event stream still shows engine work within
        `progress_window_s` (a worker answering "unhealthy" while it decodes keeps them)."""
        if not w.client.open_streams:
            return
        last = w.state.last_progress_at
        if last is not None and self._clock.now() - last <= self._config.progress_window_s:
            return
        cut = w.client.sever(f"worker {w.state.url} stopped answering ({w.state.last_error})")
        if cut:
            log.warning(
                "worker_streams_severed",
                worker=w.state.worker_id,
                url=w.state.url,
                streams=cut,
                error=w.state.last_error,
            )

    def _probe_verdict(self, w: Worker, outcome: ProbeOutcome) -> bool | None:
        """What a probe's `outcome` counts for `w` now (`homing.engines.health`)."""
        s = w.state
        load = s.load
        sample = (
            LoadSample(running=load.running, waiting=load.waiting, token_usage=load.token_usage)
            if load is not None
            else None
        )
        return probe_verdict(
            outcome,
            busy=is_busy(s.in_flight_all, sample),
            last_progress_at=s.last_progress_at,
            now=self._clock.now(),
            window_s=self._config.progress_window_s,
        )
