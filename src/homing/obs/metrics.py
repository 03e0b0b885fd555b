"""Router metrics for Prometheus (prometheus-client), served on `GET /metrics`.

Rule of this file: observation only. `RouterMetrics` is the router's observer
(`homing.router.RouterObserver`): the router calls it with each decision, KV-event batch and
flush, and it counts; gauges that describe state (index size, worker modes, stream state)
are read from the router and pool at scrape time by a custom collector, so nothing is
updated on the hot path that a scrape can compute. One instance per model, on a registry the
caller passes (the App shares one registry for all its metrics). Names follow Prometheus
conventions: `homing_router_` prefix, `_total` counters, base units (seconds, bytes).

Series (labels in braces; `model` on all):
- `homing_router_decisions_total{policy, branch}`: routing decisions by branch
  ("exact_hit", "approx_hit", "spill", "veto", "ring", "overflow", "overload",
  "round_robin", "load"; see `homing.router.types.RouteDecision`).
- `homing_router_matched_prefix_tokens`: histogram of the chosen worker's cached prefix.
- `homing_router_index_blocks{worker}` / `homing_router_index_bytes{worker}`: blocks credited
  per worker and their share of the index's estimated memory; `homing_router_index_blocks_total`
  and `homing_router_index_bytes_total`: distinct blocks and estimated bytes of the index.
- `homing_router_index_evicted_blocks_total`: blocks evicted by the global budget.
- `homing_router_worker_mode{worker, mode}`: 1 for the worker's mode ("exact" or
  "approximate"), 0 for the other.
- `homing_router_kv_event_batches_total{worker}`, `homing_router_kv_events_total{worker, kind}`.
- `homing_router_kv_gaps_total{worker}`: sequence gaps.
- `homing_router_kv_resyncs_total{worker, reason}`: index flushes by reason ("subscribe",
  "gap", "restart", "stream_error", "stream_end", "cleared", "removed", "exact_mode").
- `homing_router_kv_event_lag_seconds`: histogram of batch publish-to-apply delay.
- `homing_router_kv_stream_up{worker}`: 1 while the worker's KV-event subscription is open.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# obs is a leaf package: the router is described by the protocols below, not imported.


class _IndexView(Protocol):
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_entries(self) -> int: ...
    @property
    def stats(self) -> Any: ...
    def worker_blocks(self, worker_id: str) -> int: ...
    def mode(self, worker_id: str) -> str: ...
    def modes(self) -> Mapping[str, str]: ...
    def memory_bytes(self) -> int: ...


class _RouterView(Protocol):
    """The parts of `homing.router.Router` read here."""

    @property
    def index(self) -> _IndexView: ...
    @property
    def policy_name(self) -> str: ...

    observer: Any


class _Decision(Protocol):
    @property
    def branch(self) -> str: ...
    @property
    def matched_tokens(self) -> int: ...


class _Counts(Protocol):
    @property
    def stored(self) -> int: ...
    @property
    def removed(self) -> int: ...
    @property
    def cleared(self) -> int: ...


#: Matched-prefix buckets in tokens: one 16-token page up to a 128k context.
PREFIX_BUCKETS = (0, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)

#: Event-lag buckets in seconds: 1 ms to 10 s.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class RouterMetrics:
    """Counters of one model's router; also its `RouterObserver` (see module docstring).

    `router`: the router observed (`attach` sets `router.observer = self`).
    `model`: the `model` label. `registry`: where the series live (a new one if None).
    `workers`: called at scrape time for the worker ids to report (default: those the
    router's index knows). `streams`: called at scrape time for each worker's KV-event
    stream state ("open", "connecting", "down", "unsupported"; the pool's `kv_stream`).
    """

    def __init__(
        self,
        router: _RouterView,
        *,
        model: str,
        registry: CollectorRegistry | None = None,
        workers: Callable[[], Sequence[str]] | None = None,
        streams: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.router = router
        self.model = model
        self.registry = registry if registry is not None else CollectorRegistry()
        self._workers = workers
        self._streams = streams
        self.decisions = Counter(
            "homing_router_decisions_total",
            "Routing decisions by the branch of the policy that decided.",
            ["model", "policy", "branch"],
            registry=self.registry,
        )
        self.matched_prefix = Histogram(
            "homing_router_matched_prefix_tokens",
            "Prompt tokens the chosen worker holds as a cached prefix, per the index.",
            ["model"],
            buckets=PREFIX_BUCKETS,
            registry=self.registry,
        )
        self.batches = Counter(
            "homing_router_kv_event_batches_total",
            "KV-event batches applied to the index.",
            ["model", "worker"],
            registry=self.registry,
        )
        self.events = Counter(
            "homing_router_kv_events_total",
            "KV events applied, by kind (stored and removed count blocks).",
            ["model", "worker", "kind"],
            registry=self.registry,
        )
        self.gaps = Counter(
            "homing_router_kv_gaps_total",
            "KV-event sequence gaps (batches lost; the worker's entries were flushed).",
            ["model", "worker"],
            registry=self.registry,
        )
        self.resyncs = Counter(
            "homing_router_kv_resyncs_total",
            "Flushes of a worker's index entries, by reason.",
            ["model", "worker", "reason"],
            registry=self.registry,
        )
        self.lag = Histogram(
            "homing_router_kv_event_lag_seconds",
            "Delay from a KV-event batch's publish timestamp to its application.",
            ["model"],
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self._decision_children: dict[tuple[str, str], Any] = {}
        self._batch_children: dict[str, tuple[Any, ...]] = {}
        self._prefix = self.matched_prefix.labels(model)
        self._lag = self.lag.labels(model)
        self.registry.register(_IndexCollector(self))

    def attach(self) -> RouterMetrics:
        """Make this the router's observer; returns self."""
        self.router.observer = self
        return self

    def worker_ids(self) -> list[str]:
        """Workers reported by the scrape-time gauges."""
        if self._workers is not None:
            return list(self._workers())
        return sorted(self.router.index.modes())

    # ------------------------------------------------------------------ observer

    def on_decision(self, decision: _Decision) -> None:
        """Count the decision and its matched prefix."""
        key = (self.router.policy_name, decision.branch)  # the policy can be switched
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.decisions.labels(self.model, *key)
        child.inc()
        self._prefix.observe(decision.matched_tokens)

    def on_kv_batch(self, worker_id: str, counts: _Counts, lag_s: float | None) -> None:
        """Count the batch, its events by kind and its lag."""
        children = self._batch_children.get(worker_id)
        if children is None:  # labels() looked up once per worker, not per batch
            children = self._batch_children[worker_id] = (
                self.batches.labels(self.model, worker_id),
                *(self.events.labels(self.model, worker_id, k) for k in _EVENT_KINDS),
            )
        children[0].inc()
        for child, n in zip(
            children[1:], (counts.stored, counts.removed, counts.cleared), strict=True
        ):
            if n:
                child.inc(n)
        if lag_s is not None:
            self._lag.observe(lag_s)

    def on_flush(self, worker_id: str, reason: str) -> None:
        """Count a flush; a "gap" also counts in the gaps series."""
        self.resyncs.labels(self.model, worker_id, reason).inc()
        if reason == "gap":
            self.gaps.labels(self.model, worker_id).inc()

    def value(self, name: str, **labels: str) -> float:
        """The current value of sample `name` with `labels` (0 when absent); for tests."""
        return self.registry.get_sample_value(name, {"model": self.model, **labels}) or 0.0


_EVENT_KINDS = ("stored", "removed", "cleared")


class _IndexCollector(Collector):
    """Scrape-time gauges read from the router's index."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        index = m.router.index
        model = m.model
        workers = m.worker_ids()
        blocks = GaugeMetricFamily(
            "homing_router_index_blocks",
            "Blocks credited to the worker in the affinity index.",
            labels=["model", "worker"],
        )
        size = GaugeMetricFamily(
            "homing_router_index_bytes",
            "The worker's share of the index's estimated memory (bytes).",
            labels=["model", "worker"],
        )
        mode = GaugeMetricFamily(
            "homing_router_worker_mode",
            "1 for the worker's index mode (exact: mirrored from KV events; approximate: "
            "the router's own records with a TTL).",
            labels=["model", "worker", "mode"],
        )
        total_bytes = index.memory_bytes()
        entries = max(1, index.num_entries)
        for w in workers:
            n = index.worker_blocks(w)
            blocks.add_metric([model, w], n)
            size.add_metric([model, w], total_bytes * n / entries)
            current = index.mode(w)
            for name in ("exact", "approximate"):
                mode.add_metric([model, w, name], 1.0 if current == name else 0.0)
        yield blocks
        yield size
        yield mode
        total = GaugeMetricFamily(
            "homing_router_index_blocks_total",
            "Distinct blocks in the affinity index (the global budget caps this).",
            labels=["model"],
        )
        total.add_metric([model], index.num_blocks)
        yield total
        nbytes = GaugeMetricFamily(
            "homing_router_index_bytes_total",
            "Estimated bytes held by the affinity index.",
            labels=["model"],
        )
        nbytes.add_metric([model], total_bytes)
        yield nbytes
        evicted = CounterMetricFamily(
            "homing_router_index_evicted_blocks",
            "Blocks evicted from the index by its global memory budget.",
            labels=["model"],
        )
        evicted.add_metric([model], index.stats.evicted)
        yield evicted
        if m._streams is not None:
            up = GaugeMetricFamily(
                "homing_router_kv_stream_up",
                "1 while the worker's KV-event subscription is open.",
                labels=["model", "worker"],
            )
            for w, state in sorted(m._streams().items()):
                up.add_metric([model, w], 1.0 if state == "open" else 0.0)
            yield up
