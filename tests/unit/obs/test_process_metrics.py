"""One `/metrics` for several gateway processes: every process's series, each labelled with
its process, in one exposition that Prometheus's own parser reads back."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from homing.obs.process_metrics import merge


def _registry(requests: int, busy: float) -> bytes:
    registry = CollectorRegistry()
    counter = Counter("homing_t_requests", "Requests", ["model"], registry=registry)
    counter.labels("m").inc(requests)
    histogram = Histogram("homing_t_ttft_seconds", "TTFT", ["model"], buckets=(0.1, 1.0),
                          registry=registry)  # fmt: skip
    histogram.labels("m").observe(0.5)
    Gauge("homing_t_loop_busy", "Busy share", registry=registry).set(busy)
    return generate_latest(registry)


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if not s.name.endswith("_created")
    }


def test_each_process_keeps_its_series_under_its_process_label() -> None:
    merged = _samples(merge([(0, _registry(3, 0.25)), (1, _registry(5, 0.5))]))
    assert merged[("homing_t_requests_total", (("model", "m"), ("process", "0")))] == 3
    assert merged[("homing_t_requests_total", (("model", "m"), ("process", "1")))] == 5
    assert merged[("homing_t_loop_busy", (("process", "1"),))] == 0.5
    bucket = ("homing_t_ttft_seconds_bucket", (("le", "1.0"), ("model", "m"), ("process", "0")))
    assert merged[bucket] == 1
    assert merged[("homing_gateway_processes_scraped", ())] == 2


def test_every_family_is_written_once_with_its_type() -> None:
    text = merge([(0, _registry(1, 0.1)), (1, _registry(1, 0.1))]).decode()
    assert text.count("# TYPE homing_t_requests_total counter") == 1
    assert text.count("# TYPE homing_t_ttft_seconds histogram") == 1
    assert text.count("# TYPE homing_t_loop_busy gauge") == 1
