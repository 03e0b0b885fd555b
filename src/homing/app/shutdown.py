"""Shutdown: the drain and stop sequence of one `homing serve` process.

Rule of the file: the order things stop in, nothing else. First the autoscaler (no scaling
decision races the shutdown) with its leader leases, then the rollout controller, then the
admin API (no worker operation races it). Then both listeners stop accepting at once (gRPC
health NOT_SERVING), in-flight requests finish up to `gateway.drain_timeout_s`, those still
open end with a 503 `drained` error (a stream as its last event) within `CUT_GRACE_S`, and
admission, quotas, the fleet, the pools and homing's own workers stop; the autoscaler's
actuators stop what they started last.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from homing.app.parts import AppParts
from homing.fleet.fleet import CUT_GRACE_S
from homing.gateway.errors import drained

log = structlog.get_logger("homing.app")


class Shutdown(AppParts):
    """The stopping steps of an `App`."""

    async def stop(self) -> None:
        """Drain and stop; safe to call more than once and after a failed start."""
        self._stopping = True
        self.loop_busy.stop()
        if self._mirror_task is not None:  # a follower takes no membership change now
            self._mirror_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._mirror_task
            self._mirror_task = None
        if self._mirror_reader is not None:
            await self._mirror_reader.close()
            self._mirror_reader = None
        if self._scaler_task is not None:  # no scaling decision races the shutdown
            self._scaler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scaler_task
            self._scaler_task = None
        if self.scaler is not None:  # it no longer joins members nor stops them
            await self.scaler.close()
            self.scaler = None
        electors, self._electors = self._electors, []
        for task in electors:  # each releases its lease: another instance leads at once
            task.cancel()
        await asyncio.gather(*electors, return_exceptions=True)
        if self._leader_redis is not None:
            await self._leader_redis.aclose()
            self._leader_redis = None
        if self._rollout_task is not None:
            self._rollout_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rollout_task
            self._rollout_task = None
        if self._rollout_redis is not None:
            await self._rollout_redis.aclose()
            self._rollout_redis = None
        try:
            await self._stop_serving()
        finally:
            if self.process_metrics is not None:
                await self.process_metrics.stop()
                self.process_metrics = None
            # The actuators stop what they started (local processes) once the pools are
            # down, or after whatever failed above.
            await self._workers_released()
            actuators, self._actuators = list(self._actuators.values()), {}
            await asyncio.gather(*(a.close() for a in actuators), return_exceptions=True)

    async def _workers_released(self) -> None:
        """Wait for `keep_workers` (the other gateway processes' drain), once."""
        keep, self.keep_workers = self.keep_workers, None
        if keep is not None:
            await keep()

    async def _stop_serving(self) -> None:
        """`stop` after the autoscaler: listeners, the drain, admission, quotas, pools."""
        drain = self.config.gateway.drain_timeout_s
        if self.admin is not None:
            await self.admin.stop()  # no worker operation may race the shutdown
            self.admin = None
        if self.service is not None:
            self.service.stop_accepting()  # keep-alive connections may still send requests
        # Stop accepting on both listeners at once; open HTTP streams and gRPC calls go on
        # until they finish or the drain timeout passes.
        grpc_stopped = None
        if self.grpc is not None:
            # gRPC's own grace outlasts ours, so cut calls end with our status, not its.
            grpc_stopped = asyncio.get_running_loop().create_task(
                self.grpc.stop(grace_s=drain + CUT_GRACE_S)
            )
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
        if self.service is not None and self.service.in_flight:
            log.info("draining", in_flight=self.service.in_flight, timeout_s=drain)
            if not await self.service.drained(drain):
                cut = self.service.interrupt_all(lambda: drained(drain), outcome="drained")
                log.warning("drain_timeout", cut=cut, timeout_s=drain)
                # The cut requests send their error (a stream as its last event) and end.
                if not await self.service.drained(CUT_GRACE_S):
                    log.warning("drain_cut_timeout", in_flight=self.service.in_flight)
        if grpc_stopped is not None:
            await grpc_stopped
            self.grpc = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for admission in self.admissions.values():
            await admission.stop()
        self.admissions = {}
        if self.quotas is not None:
            await self.quotas.stop()
            self.quotas = None
        if self.fleet is not None:
            await self.fleet.stop()
        pools, self._pools = self._pools, []
        await asyncio.gather(*(pool.stop() for pool in pools))
        await self._workers_released()
        launchers, self.launchers = self.launchers, []
        await asyncio.gather(*(launcher.stop() for launcher in launchers))
