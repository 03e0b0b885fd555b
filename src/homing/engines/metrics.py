"""Prometheus series of outlier ejection and of the workers' circuit breakers and probes.

Rule of this file: the counters the ejector increments are made once per registry
(`EngineMetrics.on`); every gauge that describes state (ejected workers, breaker states)
and the counts the pool keeps on its workers (breaker opens, excused probes) are read at
scrape time from the watched pools (`watch`), so they never drift from the pool.

Series (labels `model`, `worker`):
- `homing_outlier_ejections_total{reason}`: ejections by the signal that was over
  (`tpot`, `ttft`, `errors`);
- `homing_outlier_returns_total{reason}`: readmissions (`probe`: its probe passed;
  `no_ready_worker`: the pool had no ready worker left);
- `homing_outlier_ejections_skipped_total{reason}`: outliers left in rotation
  (`max_ejected`, `last_ready`), counted each interval;
- `homing_outlier_probes_total{result}`: readmission probes (`readmitted`, `slow`, `failed`);
- `homing_outlier_ejected_workers{model}`: workers ejected now;
- `homing_worker_breaker_state{state}`: 1 for the breaker's current state (`closed`,
  `open`, `half_open`), 0 for the others;
- `homing_worker_breaker_opens_total`: times its breaker opened;
- `homing_worker_probes_excused_total`: probe timeouts not counted against its health
  because it was busy and progressing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from homing.engines.breaker import BreakerState


class WorkerCounts(Protocol):
    """What the scrape reads of a worker (`homing.engines.pool.WorkerState`)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def phase(self) -> str:
        """Its lifecycle phase (the pool's `Phase` is a `StrEnum`: its value)."""
        ...

    @property
    def breaker(self) -> str: ...
    @property
    def breaker_opens(self) -> int: ...
    @property
    def probes_excused(self) -> int: ...


#: The outlier counters by name (`EngineMetrics.outliers`): what `OutlierEjector` counts.
OutlierFamily = Literal["ejections", "returns", "skipped", "probes"]

_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, EngineMetrics] = (
    weakref.WeakKeyDictionary()
)


class EngineMetrics(Collector):
    """The series above on `registry`; use `EngineMetrics.on(registry)` (one per
    registry: prometheus-client refuses the same names twice)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "worker", "reason"]
        self.ejections = Counter(
            "homing_outlier_ejections_total",
            "Workers ejected as outliers, by the signal that was over (tpot, ttft, errors).",
            labels,
            registry=registry,
        )
        self.returns = Counter(
            "homing_outlier_returns_total",
            "Ejected workers readmitted (probe: its probe passed; no_ready_worker).",
            labels,
            registry=registry,
        )
        self.skipped = Counter(
            "homing_outlier_ejections_skipped_total",
            "Outlier intervals left in rotation (max_ejected, last_ready).",
            labels,
            registry=registry,
        )
        self.probes = Counter(
            "homing_outlier_probes_total",
            "Readmission probes of ejected workers (readmitted, slow, failed).",
            ["model", "worker", "result"],
            registry=registry,
        )
        self.outliers: dict[OutlierFamily, Counter] = {
            "ejections": self.ejections,
            "returns": self.returns,
            "skipped": self.skipped,
            "probes": self.probes,
        }
        self._watched: dict[str, Callable[[], Iterable[WorkerCounts]]] = {}
        self._labelled: dict[tuple[str, str], set[tuple[Counter, tuple[str, ...]]]] = {}
        registry.register(self)

    @classmethod
    def on(cls, registry: CollectorRegistry) -> EngineMetrics:
        """The registry's `EngineMetrics`, made on first use."""
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = _BY_REGISTRY[registry] = cls(registry)
        return metrics

    def watch(self, model: str, workers: Callable[[], Iterable[WorkerCounts]]) -> None:
        """Export `model`'s workers' breaker and probe series from `workers()` at scrape."""
        self._watched[model] = workers

    def inc(self, family: Counter, model: str, worker: str, label: str) -> None:
        """Count one in `family` for (model, worker, label), remembered for `forget`."""
        key = (model, worker, label)
        family.labels(*key).inc()
        self._labelled.setdefault((model, worker), set()).add((family, key))

    def forget(self, model: str, worker: str) -> None:
        """`worker` left `model`'s pool: remove its labelled counters."""
        for family, key in self._labelled.pop((model, worker), set()):
            try:
                family.remove(*key)
            except KeyError:
                pass

    def describe(self) -> Iterator[Metric]:
        """The scrape-time families (empty), for the registry's name check."""
        yield from _families().values()

    def collect(self) -> Iterator[Metric]:
        """Ejected workers per model, breaker state and counts per worker."""
        f = _families()
        for model, workers in self._watched.items():
            ejected = 0
            for w in workers():
                ejected += w.phase == "ejected"
                labels = [model, w.worker_id]
                for state in BreakerState:
                    f["state"].add_metric([*labels, state.value], float(w.breaker == state.value))
                f["opens"].add_metric(labels, w.breaker_opens)
                f["excused"].add_metric(labels, w.probes_excused)
            f["ejected"].add_metric([model], ejected)
        yield from f.values()


def _families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    w = ["model", "worker"]
    return {
        "ejected": GaugeMetricFamily(
            "homing_outlier_ejected_workers", "Workers ejected as outliers now.", labels=["model"]
        ),
        "state": GaugeMetricFamily(
            "homing_worker_breaker_state",
            "1 for the worker's circuit breaker state (closed, open, half_open), else 0.",
            labels=[*w, "state"],
        ),
        "opens": CounterMetricFamily(
            "homing_worker_breaker_opens",
            "Times the worker's circuit breaker opened.",
            labels=w,
        ),
        "excused": CounterMetricFamily(
            "homing_worker_probes_excused",
            "Probe timeouts not counted against the worker's health: it was busy and"
            " making progress.",
            labels=w,
        ),
    }
