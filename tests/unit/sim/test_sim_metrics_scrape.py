"""`scrape_total`: summing a sample over label sets in Prometheus text."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from homing.sim.metrics import scrape_total


def test_scrape_total_sums_label_sets_by_sample_name() -> None:
    registry = CollectorRegistry()
    slip = Counter("homing_sim_slip_wall_seconds", "slip", ["worker"], registry=registry)
    slip.labels("w0").inc(1.5)
    slip.labels("w1").inc(0.25)
    Gauge("homing_sim_max_lag_wall_seconds", "lag", registry=registry).set(0.125)
    text = generate_latest(registry).decode()
    assert scrape_total(text, "homing_sim_slip_wall_seconds_total") == 1.75
    assert scrape_total(text, "homing_sim_max_lag_wall_seconds") == 0.125
    assert scrape_total(text, "homing_sim_overrun_wall_seconds_total") == 0
