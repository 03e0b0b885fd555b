"""Outlier and breaker series: one set per registry, state read from the pools at scrape
time, a departed worker's counters removed."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from homing.engines.metrics import EngineMetrics


@dataclass
class W:
    worker_id: str
    phase: str = "ready"
    breaker: str = "closed"
    breaker_opens: int = 0
    probes_excused: int = 0


def test_scrape_reads_breakers_and_ejections_from_the_watched_workers() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics.on(registry)
    assert EngineMetrics.on(registry) is metrics  # one per registry
    workers = [W("w0", phase="ejected"), W("w1", breaker="open", breaker_opens=2, probes_excused=3)]
    metrics.watch("m", lambda: workers)
    get = registry.get_sample_value
    assert get("homing_outlier_ejected_workers", {"model": "m"}) == 1
    w1 = {"model": "m", "worker": "w1"}
    assert get("homing_worker_breaker_state", {**w1, "state": "open"}) == 1
    assert get("homing_worker_breaker_state", {**w1, "state": "closed"}) == 0
    assert get("homing_worker_breaker_opens_total", w1) == 2
    assert get("homing_worker_probes_excused_total", w1) == 3


def test_a_departed_workers_counters_are_removed() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics.on(registry)
    metrics.inc(metrics.ejections, "m", "w0", "tpot")
    metrics.inc(metrics.returns, "m", "w0", "probe")
    labels = {"model": "m", "worker": "w0"}
    get = registry.get_sample_value
    assert get("homing_outlier_ejections_total", {**labels, "reason": "tpot"}) == 1
    metrics.forget("m", "w0")
    assert get("homing_outlier_ejections_total", {**labels, "reason": "tpot"}) is None
    assert get("homing_outlier_returns_total", {**labels, "reason": "probe"}) is None
