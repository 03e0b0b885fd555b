"""Router and fleet metrics for Prometheus (prometheus-client), served on `GET /metrics`.

Rule of this file: observation only. `RouterMetrics` is the router's observer
(`homing.router.RouterObserver`): the router calls it with each decision, KV-event batch and
flush, and it counts; gauges that describe state (index size, worker modes, stream state)
are read from the router and pool at scrape time by a custom collector, so nothing is
updated on the hot path that a scrape can compute. One instance per model, on a registry the
caller passes (the App shares one registry for all its metrics): the metric families and one
scrape-time collector exist once per registry, and each instance adds its model's label
values. `FleetMetrics` (one per registry) counts worker lifecycle transitions and reports
workers per phase at scrape time. Names follow Prometheus conventions: `homing_` prefix,
`_total` counters, base units (seconds, bytes).

Router series (labels in braces; `model` on all):
- `homing_router_decisions_total{policy, branch}`: routing decisions by branch
  ("exact_hit", "approx_hit", "veto", "ring", "overflow", "overload",
  "round_robin", "load"; see `homing.router.types.RouteDecision`).
- `homing_router_matched_prefix_tokens`: histogram of the chosen worker's cached prefix.
- `homing_router_cached_tokens_total{worker}` / `homing_router_prefill_tokens_total{worker}`:
  prompt tokens of routed requests the index credits the chosen worker with, and those it
  expects that worker to prefill (not cached there; what the dispatch ledger charges it).
  `rate(cached) / (rate(cached) + rate(prefill))` is the router's expected hit ratio, and
  `rate(prefill)` its expected prefill demand in tokens/s: a restart or flushed index shows
  as a dip in the one and a rise in the other, then recovery.
- `homing_router_index_blocks{worker}` / `homing_router_index_bytes{worker}`: blocks credited
  per worker and their share of the index's estimated memory; `homing_router_index_blocks_total`
  and `homing_router_index_bytes_total`: distinct blocks and estimated bytes of the index.
- `homing_router_index_evicted_blocks_total`: blocks evicted by the global budget.
- `homing_router_worker_mode{worker, mode}`: 1 for the worker's mode ("exact" or
  "approximate"), 0 for the other.
- `homing_router_kv_event_batches_total{worker}`, `homing_router_kv_events_total{worker, kind}`.
- `homing_router_kv_gaps_total{worker}`: sequence gaps.
- `homing_router_kv_resyncs_total{worker, reason}`: index flushes by reason ("subscribe",
  "gap", "restart", "stream_error", "stream_end", "cleared", "exact_mode"). A worker that
  leaves the pool (the router's "removed" flush) leaves none of its `worker` series behind.
- `homing_router_kv_event_lag_seconds`: histogram of batch publish-to-apply delay.
- `homing_router_kv_stream_up{worker}`: 1 while the worker's KV-event subscription is open.

Fleet series (`model` on all):
- `homing_worker_transitions_total{action, from_phase, to_phase}`: worker lifecycle
  transitions (phases "joining", "ready", "cordoned", "draining", "ejected", "gone"; see
  `homing.engines.lifecycle`).
- `homing_workers{phase}`: workers of the model in each phase; a phase reported once for a
  model is reported as 0 when it empties.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter as _Tally
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    def worker_id(self) -> str: ...
    @property
    def branch(self) -> str: ...
    @property
    def matched_tokens(self) -> int: ...
    @property
    def uncached_tokens(self) -> int: ...


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
    `model`: the `model` label. `registry`: where the series live (a new one if None); any
    number of instances with different models may share one. `workers`: called at scrape time
    for the worker ids to report (default: those the router's index knows). `streams`: called
    at scrape time for each worker's KV-event stream state ("open", "connecting", "down",
    "unsupported"; the pool's `kv_stream`). Raises `ValueError` when `registry` already has
    an attached-to-collector instance for `model` (`detach` that one first).
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
        series = _router_series(self.registry)
        self._series = series
        self.decisions = series.decisions
        self.matched_prefix = series.matched_prefix
        self.batches = series.batches
        self.events = series.events
        self.gaps = series.gaps
        self.resyncs = series.resyncs
        self.lag = series.lag
        self.cached_tokens = series.cached_tokens
        self.prefill_tokens = series.prefill_tokens
        self._decision_children: dict[tuple[str, str], Any] = {}
        self._token_children: dict[str, tuple[Any, Any]] = {}
        self._batch_children: dict[str, tuple[Any, ...]] = {}
        self._flush_children: dict[tuple[str, str], Any] = {}
        self._prefix = self.matched_prefix.labels(model)
        self._lag = self.lag.labels(model)
        series.add(self)

    def attach(self) -> RouterMetrics:
        """Make this the router's observer; returns self."""
        self.router.observer = self
        return self

    def detach(self) -> None:
        """Stop reporting this model's scrape-time gauges and free its `model` label on the
        registry for a new instance. Its counters stay (a new instance for the model goes on
        counting them); the router's observer is left as it is. Idempotent."""
        self._series.discard(self)

    def worker_ids(self) -> list[str]:
        """Workers reported by the scrape-time gauges."""
        if self._workers is not None:
            return list(self._workers())
        return sorted(self.router.index.modes())

    # ------------------------------------------------------------------ observer

    def on_decision(self, decision: _Decision) -> None:
        """Count the decision, its matched prefix and its expected cached / prefill tokens."""
        key = (self.router.policy_name, decision.branch)  # the policy can be switched
        child = self._decision_children.get(key)
        if child is None:
            child = self._decision_children[key] = self.decisions.labels(self.model, *key)
        child.inc()
        matched = decision.matched_tokens
        self._prefix.observe(matched)
        worker_id = decision.worker_id
        tokens = self._token_children.get(worker_id)
        if tokens is None:
            tokens = self._token_children[worker_id] = (
                self.cached_tokens.labels(self.model, worker_id),
                self.prefill_tokens.labels(self.model, worker_id),
            )
        if matched:
            tokens[0].inc(matched)
        if decision.uncached_tokens:
            tokens[1].inc(decision.uncached_tokens)

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
        """Count a flush; a "gap" also counts in the gaps series. "removed" (the worker left
        the pool) removes the worker's series instead (`forget_worker`)."""
        if reason == "removed":
            self.forget_worker(worker_id)
            return
        key = (worker_id, reason)
        child = self._flush_children.get(key)
        if child is None:
            child = self._flush_children[key] = self.resyncs.labels(self.model, *key)
        child.inc()
        if reason == "gap":
            self.gaps.labels(self.model, worker_id).inc()

    def forget_worker(self, worker_id: str) -> None:
        """Remove every counter series of `worker_id` (it left the pool)."""
        self._batch_children.pop(worker_id, None)
        self._token_children.pop(worker_id, None)
        for key in [k for k in self._flush_children if k[0] == worker_id]:
            del self._flush_children[key]
        families = (self.batches, self.events, self.gaps, self.resyncs)
        for family in (*families, self.cached_tokens, self.prefill_tokens):
            for labels in list(family._metrics):  # prometheus-client's children by labels
                if labels[0] == self.model and labels[1] == worker_id:
                    family.remove(*labels)

    def value(self, name: str, **labels: str) -> float:
        """The current value of sample `name` with `labels` (0 when absent); for tests."""
        return self.registry.get_sample_value(name, {"model": self.model, **labels}) or 0.0


_EVENT_KINDS = ("stored", "removed", "cleared")


class _RouterSeries(Collector):
    """The router metric families of one registry, shared by its `RouterMetrics`, and the
    registry's one collector of the scrape-time gauges of every model added."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "homing_router_decisions_total",
            "Routing decisions by the branch of the policy that decided.",
            ["model", "policy", "branch"],
            registry=registry,
        )
        self.matched_prefix = Histogram(
            "homing_router_matched_prefix_tokens",
            "Prompt tokens the chosen worker holds as a cached prefix, per the index.",
            ["model"],
            buckets=PREFIX_BUCKETS,
            registry=registry,
        )
        self.cached_tokens = Counter(
            "homing_router_cached_tokens_total",
            "Prompt tokens of routed requests the index credits the chosen worker with.",
            ["model", "worker"],
            registry=registry,
        )
        self.prefill_tokens = Counter(
            "homing_router_prefill_tokens_total",
            "Prompt tokens of routed requests the router expects the chosen worker to prefill"
            " (not cached there per the index).",
            ["model", "worker"],
            registry=registry,
        )
        self.batches = Counter(
            "homing_router_kv_event_batches_total",
            "KV-event batches applied to the index.",
            ["model", "worker"],
            registry=registry,
        )
        self.events = Counter(
            "homing_router_kv_events_total",
            "KV events applied, by kind (stored and removed count blocks).",
            ["model", "worker", "kind"],
            registry=registry,
        )
        self.gaps = Counter(
            "homing_router_kv_gaps_total",
            "KV-event sequence gaps (batches lost; the worker's entries were flushed).",
            ["model", "worker"],
            registry=registry,
        )
        self.resyncs = Counter(
            "homing_router_kv_resyncs_total",
            "Flushes of a worker's index entries, by reason.",
            ["model", "worker", "reason"],
            registry=registry,
        )
        self.lag = Histogram(
            "homing_router_kv_event_lag_seconds",
            "Delay from a KV-event batch's publish timestamp to its application.",
            ["model"],
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self._lock = threading.Lock()
        self._models: dict[str, RouterMetrics] = {}
        registry.register(self)

    def add(self, metrics: RouterMetrics) -> None:
        """Report `metrics`' gauges; `ValueError` if its model already has an instance."""
        with self._lock:
            if metrics.model in self._models:
                raise ValueError(
                    f"model {metrics.model!r} already has RouterMetrics on this registry "
                    "(detach() it first)"
                )
            self._models[metrics.model] = metrics

    def discard(self, metrics: RouterMetrics) -> None:
        """Stop reporting `metrics`' gauges (no-op when it is not the model's instance)."""
        with self._lock:
            if self._models.get(metrics.model) is metrics:
                del self._models[metrics.model]

    def describe(self) -> Iterator[Metric]:
        """The scrape-time families (empty), so the registry can check names for clashes."""
        yield from _index_families()

    def collect(self) -> Iterator[Metric]:
        """The scrape-time gauges of every model, sorted by model."""
        with self._lock:
            models = sorted(self._models.items())
        blocks, size, mode, total, nbytes, evicted, up = _index_families()
        any_streams = False
        for model, m in models:
            index = m.router.index
            total_bytes = index.memory_bytes()
            entries = max(1, index.num_entries)
            for w in m.worker_ids():
                n = index.worker_blocks(w)
                blocks.add_metric([model, w], n)
                size.add_metric([model, w], total_bytes * n / entries)
                current = index.mode(w)
                for name in ("exact", "approximate"):
                    mode.add_metric([model, w, name], 1.0 if current == name else 0.0)
            total.add_metric([model], index.num_blocks)
            nbytes.add_metric([model], total_bytes)
            evicted.add_metric([model], index.stats.evicted)
            if m._streams is not None:
                any_streams = True
                for w, state in sorted(m._streams().items()):
                    up.add_metric([model, w], 1.0 if state == "open" else 0.0)
        if not models:
            return
        yield from (blocks, size, mode, total, nbytes, evicted)
        if any_streams:
            yield up


def _index_families() -> tuple[
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    GaugeMetricFamily,
    CounterMetricFamily,
    GaugeMetricFamily,
]:
    """Empty scrape-time router families: blocks, bytes, mode, blocks total, bytes total,
    evicted, stream up."""
    return (
        GaugeMetricFamily(
            "homing_router_index_blocks",
            "Blocks credited to the worker in the affinity index.",
            labels=["model", "worker"],
        ),
        GaugeMetricFamily(
            "homing_router_index_bytes",
            "The worker's share of the index's estimated memory (bytes).",
            labels=["model", "worker"],
        ),
        GaugeMetricFamily(
            "homing_router_worker_mode",
            "1 for the worker's index mode (exact: mirrored from KV events; approximate: "
            "the router's own records with a TTL).",
            labels=["model", "worker", "mode"],
        ),
        GaugeMetricFamily(
            "homing_router_index_blocks_total",
            "Distinct blocks in the affinity index (the global budget caps this).",
            labels=["model"],
        ),
        GaugeMetricFamily(
            "homing_router_index_bytes_total",
            "Estimated bytes held by the affinity index.",
            labels=["model"],
        ),
        CounterMetricFamily(
            "homing_router_index_evicted_blocks",
            "Blocks evicted from the index by its global memory budget.",
            labels=["model"],
        ),
        GaugeMetricFamily(
            "homing_router_kv_stream_up",
            "1 while the worker's KV-event subscription is open.",
            labels=["model", "worker"],
        ),
    )


# Registry -> its router series. Values are weak too: the series refers (through its
# RouterMetrics) to the registry, so a strong value would keep every registry alive. The
# registry itself holds the series strongly, as one of its collectors.
_ROUTER_SERIES: weakref.WeakKeyDictionary[CollectorRegistry, weakref.ref[_RouterSeries]] = (
    weakref.WeakKeyDictionary()
)
_ROUTER_SERIES_LOCK = threading.Lock()


def _router_series(registry: CollectorRegistry) -> _RouterSeries:
    """The router series of `registry`, made (and registered on it) on first use."""
    with _ROUTER_SERIES_LOCK:
        ref = _ROUTER_SERIES.get(registry)
        series = ref() if ref is not None else None
        if series is None:
            series = _RouterSeries(registry)
            _ROUTER_SERIES[registry] = weakref.ref(series)
        return series


class FleetMetrics(Collector):
    """Worker lifecycle metrics of every model on `registry` (see module docstring).

    One per registry: a second on the same registry raises prometheus-client's
    `ValueError` (duplicated timeseries). `on_transition` counts; `watch` gives, per model,
    the callable read at scrape time for the phases of that model's current workers.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.transitions = Counter(
            "homing_worker_transitions_total",
            "Worker lifecycle transitions, by action and the phases before and after.",
            ["model", "action", "from_phase", "to_phase"],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._watched: dict[str, Callable[[], Iterable[str]]] = {}
        self._seen: dict[str, set[str]] = {}
        registry.register(self)

    def on_transition(self, model: str, action: str, before: str, after: str) -> None:
        """Count one transition of a `model` worker from phase `before` to `after`."""
        self.transitions.labels(model, action, before, after).inc()

    def watch(self, model: str, phases: Callable[[], Iterable[str]]) -> None:
        """Report `model`'s workers per phase from `phases()` (the phase of each current
        worker, one entry per worker), called at each scrape; replaces an earlier callable
        for `model` and keeps the phases it reported."""
        with self._lock:
            self._watched[model] = phases
            self._seen.setdefault(model, set())

    def unwatch(self, model: str) -> None:
        """Stop reporting `model`'s workers per phase, and forget its phases. Idempotent."""
        with self._lock:
            self._watched.pop(model, None)
            self._seen.pop(model, None)

    def value(self, name: str, **labels: str) -> float:
        """The current value of sample `name` with `labels` (0 when absent); for tests."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def describe(self) -> Iterator[Metric]:
        """The scrape-time family (empty), so the registry can check names for clashes."""
        yield _workers_family()

    def collect(self) -> Iterator[Metric]:
        """`homing_workers{model, phase}` for every watched model, sorted."""
        with self._lock:
            watched = sorted(self._watched.items())
        if not watched:
            return
        family = _workers_family()
        for model, phases in watched:
            counts = _Tally(str(p) for p in phases())
            with self._lock:
                seen = self._seen.get(model)
                if seen is None:  # unwatched during this scrape
                    continue
                seen.update(counts)
                names = sorted(seen)
            for phase in names:
                family.add_metric([model, phase], counts.get(phase, 0))
        yield family


def _workers_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(
        "homing_workers", "Workers of the model in each lifecycle phase.", labels=["model", "phase"]
    )
