"""Outlier ejection in a running gateway over simulated worker processes: a worker slowed
10x under a steady streaming load leaves rotation and comes back once it is fast again; a
slowed worker that is the pool's last ready one is never ejected."""

from __future__ import annotations

import asyncio
import time

from helpers import eventually, own_app, post_fault
from stream_load import StreamLoad
from structlog.testing import capture_logs

from homing.app import App
from homing.config import (
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    OutlierSettings,
    SimSettings,
)
from homing.engines.lifecycle import Phase

MODEL = "llama-3.1-8b"


def config(**outliers: object) -> HomingConfig:
    """Two simulated workers at 10x speed, outlier detection every second."""
    settings = {
        "interval_s": 1.0,
        "window_s": 3.0,
        "consecutive": 2,
        "min_requests": 3,
        "base_ejection_s": 4.0,
        "probe_timeout_s": 5.0,
        **outliers,
    }
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            health_interval_s=0.2,
            outliers=OutlierSettings.model_validate(settings),
        ),
        sim=SimSettings(workers=2, speedup=10.0),
    )


def sample(app: App, name: str, **labels: str) -> float:
    value = app.gateway_metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_a_worker_slowed_10x_is_ejected_and_returns_once_fast_again() -> None:
    """Slowed 10x under 6 streams: ejected within 30 s; back within 60 s of `slowdown 1`.
    No client request fails throughout."""
    async with own_app(config()) as app:
        assert app.pool is not None and app.model is not None
        pool = app.pool
        w0, w1 = pool.workers()
        with capture_logs() as logs:
            async with StreamLoad(app.http_port or 0, model=MODEL, concurrency=6) as load:
                assert await eventually(lambda: load.ok >= 12, 10.0)
                slowed_at = time.monotonic()
                await post_fault(w0.url, {"slowdown": 10})
                assert await eventually(lambda: w0.phase is Phase.EJECTED, 30.0)
                ejected_s = time.monotonic() - slowed_at
                assert w1.phase is Phase.READY
                served_while_out = load.by_worker[w1.worker_id]
                await asyncio.sleep(2.0)
                assert load.by_worker[w1.worker_id] > served_while_out  # the pool serves on
                fast_at = time.monotonic()
                await post_fault(w0.url, {"slowdown": 1})
                assert await eventually(lambda: w0.phase is Phase.READY, 60.0)
                returned_s = time.monotonic() - fast_at
                before = load.by_worker[w0.worker_id]
                assert await eventually(lambda: load.by_worker[w0.worker_id] > before, 10.0)
        print(f"ejected after {ejected_s:.1f} s, returned after {returned_s:.1f} s")
        assert load.failed == []
        ejected = [e for e in logs if e["event"] == "outlier_ejected"]
        assert [(e["worker"], e["reason"]) for e in ejected][:1] == [(w0.worker_id, "tpot")]
        assert ejected[0]["value"] > 3 * ejected[0]["baseline"]
        probes = [e for e in logs if e["event"] == "outlier_probe"]
        assert probes[-1]["result"] == "readmitted" and probes[-1]["peer"] == w1.worker_id
        labels = {"model": MODEL, "worker": w0.worker_id}
        assert sample(app, "homing_outlier_ejections_total", **labels, reason="tpot") >= 1
        assert sample(app, "homing_outlier_returns_total", **labels, reason="probe") >= 1
        assert sample(app, "homing_outlier_ejected_workers", model=MODEL) == 0


async def test_a_slowed_worker_that_is_the_last_ready_one_is_never_ejected() -> None:
    """Both serve, then w1 is cordoned and w0 slowed 10x: w0 is an outlier against w1's
    recent requests, but the pool's only ready worker, so it is kept (and says so), and
    every request is served."""
    async with own_app(config(window_s=20.0)) as app:
        assert app.pool is not None and app.fleet is not None
        pool = app.pool
        w0, w1 = pool.workers()
        labels = {"model": MODEL, "worker": w0.worker_id, "reason": "last_ready"}
        async with StreamLoad(app.http_port or 0, model=MODEL, concurrency=6) as load:
            assert await eventually(
                lambda: min(load.by_worker[w0.worker_id], load.by_worker[w1.worker_id]) >= 5, 10.0
            )
            app.fleet.cordon(w1.worker_id)
            await post_fault(w0.url, {"slowdown": 10})
            kept = await eventually(
                lambda: sample(app, "homing_outlier_ejections_skipped_total", **labels) >= 2, 30.0
            )
            assert w0.phase is Phase.READY
        assert kept, "w0 never was an outlier against w1"
        assert load.failed == []
        assert sample(app, "homing_outlier_ejections_total", model=MODEL, worker=w0.worker_id,
                      reason="tpot") == 0  # fmt: skip
