"""Request metrics, SLO verdicts and the request log: everything a finished request reports.

Rule of this file: `RequestRecorder.done` is the one place a request's end is reported. It
writes the request's one `request_done` log line (structlog, logger `homing.request`),
observes its metrics, judges it against its model's SLO (`homing.obs.slo`) and adds it to
its worker's recent records (`homing.obs.replica`). Gauges that describe state (SLO burn
rates, goodput, per-worker snapshots) are computed at scrape time by a collector, so the
request path only counts. Labels come from the server's own names (served models, worker
ids, version labels, configured tenants), never from a client's strings.

Series (see docs/observability.md for the full list): request histograms
`homing_request_{ttft,tpot,e2e,queue}_seconds` and `homing_request_{prompt,cached,
completion}_tokens`, `homing_requests_total{outcome, finish_reason}`, token counters,
`homing_requests_in_flight`, `homing_slo_*`, `homing_goodput_*` and `homing_worker_*`.
Labels `model`, `version`, `worker` (and `tenant` with `tenant_labels`); a worker that
leaves is removed from every series (`forget_worker`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from homing.obs.demand import DemandMeter
from homing.obs.replica import AttemptRecord, ReplicaSnapshot, ReplicaStats, WorkerView
from homing.obs.slo import BURN_WINDOWS, Slo, SloTracker, Verdict, judge

log = structlog.get_logger("homing.request")

#: TTFT buckets (s): 5 ms up to 2 minutes (long prompts in a queue reach tens of seconds).
TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0,
    3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
)  # fmt: skip
#: TPOT buckets (s): 1 ms up to 5 s per token.
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
#: End-to-end buckets (s): 50 ms up to 30 minutes (long reasoning answers).
E2E_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
    180.0, 300.0, 600.0, 900.0, 1200.0, 1800.0,
)  # fmt: skip
#: Queue buckets (s): routed at once up to the admission queue's 10-minute default limit.
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 120.0, 300.0, 600.0)  # fmt: skip
#: Token-count buckets: 1 token up to a 128k context.
TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                 131072)  # fmt: skip


@dataclass
class RequestDone:
    """What one request reports when it ends (every path, refusals included).

    `model` / `version` / `worker`: "" when not known (refused before routing). Times in
    seconds (None when not reached or not known): `ttft_s` and `e2e_s` from its arrival,
    `queue_s` from its start (quota, admission) to routing, None exactly when it was never
    routed, `routed_ttft_s` from the serving worker's lease to its first token (its share;
    a retried request's earlier attempts excluded); `choices`:
    `n`; `streamed`: its engine sent tokens as they came (False: each answer whole);
    `status`: the HTTP status of a refusal (None
    otherwise); `outcome`: "ok" or how it ended (`homing.gateway.generation`), or
    `error_<status>` with `error_code` for a refusal. `fields`: further log fields
    (API, path, finish reasons, engine ids, ...), logged as they are. `worker_part`: what
    `worker`'s replica stats get (the attempt it served, of a retried or migrated
    request); None: the request's own figures, failed when the outcome is "engine_error".
    `pinned`: the client chose the version (`x-homing-version`), not the split.
    """

    request_id: str
    outcome: str
    model: str = ""
    version: str = ""
    pinned: bool = False
    worker: str = ""
    tenant: str | None = None
    status: int | None = None
    error_code: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    queue_s: float | None = None
    routed_ttft_s: float | None = None
    choices: int = 1
    streamed: bool = True
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    worker_part: AttemptRecord | None = None


class _Children:
    """The labelled children of one (model, version, worker, tenant), looked up once."""

    __slots__ = (
        "cached",
        "completion",
        "e2e",
        "g_out",
        "key",
        "p_in",
        "prompt",
        "queue",
        "tpot",
        "ttft",
    )  # fmt: skip

    def __init__(self, m: RequestMetrics, key: tuple[str, ...]) -> None:
        self.key = key
        self.ttft = m.ttft.labels(*key)
        self.tpot = m.tpot.labels(*key)
        self.e2e = m.e2e.labels(*key)
        self.queue = m.queue.labels(*key)
        self.prompt = m.prompt_tokens.labels(*key)
        self.cached = m.cached_tokens.labels(*key)
        self.completion = m.completion_tokens.labels(*key)
        self.p_in = m.tokens_in.labels(*key)
        self.g_out = m.tokens_out.labels(*key)


class RequestMetrics:
    """The request, SLO and per-worker metric families on `registry`.

    `tenant_labels`: add a `tenant` label to the request series (off: one series set per
    worker, whatever the number of tenants). One per registry (prometheus-client refuses
    the same names twice with `ValueError`).
    """

    def __init__(self, registry: CollectorRegistry, *, tenant_labels: bool = False) -> None:
        self.registry = registry
        self.tenant_labels = tenant_labels
        base = ["model", "version", "worker"] + (["tenant"] if tenant_labels else [])
        self._base = base

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, base, buckets=buckets, registry=registry)

        self.ttft = hist("homing_request_ttft_seconds", "Time to first token.", TTFT_BUCKETS)
        self.tpot = hist(
            "homing_request_tpot_seconds",
            "A request's mean time per output token after the first (streamed engines only).",
            TPOT_BUCKETS,
        )
        self.e2e = hist("homing_request_e2e_seconds", "Request arrival to its end.", E2E_BUCKETS)
        self.queue = hist(
            "homing_request_queue_seconds",
            "A parsed request's wait for its routing decision (quota and admission queue).",
            QUEUE_BUCKETS,
        )
        self.prompt_tokens = hist(
            "homing_request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS
        )
        self.cached_tokens = hist(
            "homing_request_cached_tokens",
            "Prompt tokens per request served from the engine's prefix cache.",
            TOKEN_BUCKETS,
        )
        self.completion_tokens = hist(
            "homing_request_completion_tokens",
            "Completion tokens per request (all choices).",
            TOKEN_BUCKETS,
        )
        self.requests = Counter(
            "homing_requests_total",
            "Requests by outcome (ok with its finish_reason; else how it ended or the"
            " refusal's error code).",
            [*base, "outcome", "finish_reason"],
            registry=registry,
        )
        self.tokens_in = Counter(
            "homing_prompt_tokens_total", "Prompt tokens of ended requests.", base,
            registry=registry,
        )  # fmt: skip
        self.tokens_out = Counter(
            "homing_generation_tokens_total", "Completion tokens of ended requests.", base,
            registry=registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "homing_requests_in_flight",
            "Open requests of the model (quota, admission queue and streaming).",
            ["model"],
            registry=registry,
        )
        slo_base = ["model", "version"] + (["tenant"] if tenant_labels else [])
        self.slo_requests = Counter(
            "homing_slo_requests_total",
            "Requests judged against the model's SLO, by verdict (met, missed, failed).",
            [*slo_base, "verdict"],
            registry=registry,
        )
        self.goodput_tokens = Counter(
            "homing_slo_goodput_tokens_total",
            "Completion tokens of requests that met the SLO.",
            slo_base,
            registry=registry,
        )
        self._children: dict[tuple[str, ...], _Children] = {}
        self._by_worker: dict[tuple[str, str], set[tuple[str, ...]]] = {}
        self._versions: set[tuple[str, str]] = set()

    def start_version(self, model: str, version: str) -> None:
        """Create `model`/`version`'s SLO series at 0 (once), so `rate()` sees their first
        increase."""
        if (model, version) in self._versions or self.tenant_labels:
            return
        self._versions.add((model, version))
        for verdict in ("met", "missed", "failed"):
            self.slo_requests.labels(model, version, verdict)
        self.goodput_tokens.labels(model, version)

    def children(self, key: tuple[str, ...]) -> _Children:
        """The series of `key` (model, version, worker[, tenant]), made on first use."""
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = _Children(self, key)
            if key[2]:
                self._by_worker.setdefault((key[0], key[2]), set()).add(key)
        return c

    def forget_worker(self, model: str, worker: str) -> None:
        """Remove every series labelled with `worker` of `model`."""
        keys = self._by_worker.pop((model, worker), set())
        for key in keys:
            self._children.pop(key, None)
            for family in (self.ttft, self.tpot, self.e2e, self.queue, self.prompt_tokens,
                           self.cached_tokens, self.completion_tokens, self.tokens_in,
                           self.tokens_out):  # fmt: skip
                _remove(family, key)
        n = len(self._base)
        for labels in _label_sets(self.requests):
            if labels[0] == model and labels[2] == worker and len(labels) == n + 2:
                _remove(self.requests, labels)


def _label_sets(family: Counter | Histogram) -> Iterable[tuple[str, ...]]:
    return list(family._metrics)  # prometheus-client keeps children by label tuple


def _remove(family: Counter | Histogram, labels: tuple[str, ...]) -> None:
    try:
        family.remove(*labels)
    except KeyError:
        pass


class RequestRecorder(Collector):
    """Reports each ended request (`done`), counts open ones, and exports the per-model SLO
    status and per-worker snapshots at scrape time.

    `slos`: each served model's SLO (`default_slo` for others). `now`: the clock (s).
    `metrics`: None records no metrics (log lines, SLO and snapshots only).
    `on_done`: called with each ended request and its verdict (after its metrics);
    `on_failed_attempt`: with (model, worker id) of each attempt a worker failed that the
    request survived. Listeners run on the request path: they must not block.
    """

    def __init__(
        self,
        *,
        now: Callable[[], float],
        metrics: RequestMetrics | None,
        slos: Mapping[str, Slo] | None = None,
        default_slo: Slo | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.metrics = metrics
        self._now = now
        self.default_slo = default_slo or Slo()
        self._slos = dict(slos or {})
        self._trackers: dict[str, SloTracker] = {}
        self.replicas = ReplicaStats(now=now)
        self.opened = 0
        self._watched: dict[str, Callable[[], Iterable[WorkerView]]] = {}
        self._demand: dict[str, DemandMeter] = {}
        self._in_flight: dict[str, Any] = {}
        # Workers that left (insertion-ordered, the oldest dropped past `_GONE_KEPT`): a
        # request of theirs that ends later is counted without its worker label.
        self._gone: dict[tuple[str, str], None] = {}
        self.on_done: list[Callable[[RequestDone, Verdict | None], None]] = []
        self.on_failed_attempt: list[Callable[[str, str], None]] = []
        if registry is not None:
            registry.register(self)

    # -- the request path --

    def set_slo(self, model: str, slo: Slo) -> None:
        """Judge `model`'s requests against `slo` from now on (its window starts anew)."""
        self._slos[model] = slo
        self._trackers.pop(model, None)

    def slo(self, model: str) -> Slo:
        """`model`'s SLO."""
        return self._slos.get(model, self.default_slo)

    def tracker(self, model: str) -> SloTracker:
        """`model`'s SLO tracker (made on first use)."""
        t = self._trackers.get(model)
        if t is None:
            t = self._trackers[model] = SloTracker(self.slo(model), now=self._now)
        return t

    def meter_demand(self, model: str, meter: DemandMeter) -> None:
        """Report `model`'s arrivals (`started`) and first-token times (`done`) to `meter`."""
        self._demand[model] = meter

    def started(self, model: str) -> None:
        """A request of `model` opened (its `done` follows exactly once); counted in
        `opened` (all models, since start)."""
        self.opened += 1
        self._gauge(model).inc()
        meter = self._demand.get(model)
        if meter is not None:
            meter.arrived()

    def ended(self, model: str) -> None:
        """A request of `model` closed."""
        self._gauge(model).dec()

    def _gauge(self, model: str) -> Any:
        g = self._in_flight.get(model)
        if g is None:
            g = self._in_flight[model] = (
                self.metrics.in_flight.labels(model) if self.metrics else _NoGauge()
            )
        return g

    def done(self, r: RequestDone) -> Verdict | None:
        """Log, count and judge one ended request; returns its SLO verdict."""
        verdict: Verdict | None = None
        if (r.model, r.worker) in self._gone:
            r.worker = ""
        if r.model:
            verdict = judge(
                self.slo(r.model),
                r.outcome,
                r.status,
                r.ttft_s,
                r.tpot_s,
                e2e_s=r.e2e_s,
                tokens_per_choice=r.completion_tokens / max(1, r.choices),
                streamed=r.streamed,
            )
            if verdict is not None:
                self.tracker(r.model).record(verdict, r.completion_tokens)
            meter = self._demand.get(r.model)
            if meter is not None and r.ttft_s is not None:
                meter.first_token(r.ttft_s)
        if r.worker and r.worker_part is not None:
            self.replicas.record_attempt(replace(r.worker_part, worker_id=r.worker))
        elif r.worker:
            self.replicas.record(
                r.worker,
                failed=r.outcome == "engine_error",
                prompt_tokens=r.prompt_tokens,
                cached_tokens=r.cached_tokens,
                ttft_s=r.routed_ttft_s,
                tpot_s=r.tpot_s,
                completion_tokens=r.completion_tokens,
            )
        if self.metrics is not None:
            self._observe(self.metrics, r, verdict)
        log.info(
            "request_done",
            request_id=r.request_id,
            tenant=r.tenant,
            model=r.model or None,
            version=r.version if r.model else None,
            worker=r.worker or None,
            prompt_tokens=r.prompt_tokens,
            cached_tokens=r.cached_tokens,
            completion_tokens=r.completion_tokens,
            ttft_ms=_ms(r.ttft_s),
            tpot_ms=_ms(r.tpot_s),
            e2e_ms=_ms(r.e2e_s),
            queue_ms=_ms(r.queue_s),
            routed_ttft_ms=_ms(r.routed_ttft_s),
            outcome=r.outcome,
            error_code=r.error_code,
            slo=verdict,
            **r.fields,
        )
        for listener in self.on_done:
            listener(r, verdict)
        return verdict

    def _observe(self, m: RequestMetrics, r: RequestDone, verdict: Verdict | None) -> None:
        key: tuple[str, ...] = (r.model, r.version, r.worker)
        if m.tenant_labels:
            key = (*key, r.tenant or "")
        if r.queue_s is None:  # never routed: counted, and its time
            if r.e2e_s is not None:
                m.e2e.labels(*key).observe(r.e2e_s)
        else:
            c = m.children(key)
            if r.ttft_s is not None:
                c.ttft.observe(r.ttft_s)
            if r.tpot_s is not None:
                c.tpot.observe(r.tpot_s)
            if r.e2e_s is not None:
                c.e2e.observe(r.e2e_s)
            c.queue.observe(r.queue_s)
            c.prompt.observe(r.prompt_tokens)
            c.cached.observe(r.cached_tokens)
            c.completion.observe(r.completion_tokens)
            c.p_in.inc(r.prompt_tokens)
            c.g_out.inc(r.completion_tokens)
        outcome = r.outcome
        if r.status is not None and r.error_code:
            outcome = r.error_code  # a refusal: its error code
        m.requests.labels(*key, outcome, r.finish_reason if outcome == "ok" else "").inc()
        if verdict is not None:
            slo_key = (r.model, r.version) + ((r.tenant or "",) if m.tenant_labels else ())
            m.slo_requests.labels(*slo_key, verdict).inc()
            if verdict == "met":
                m.goodput_tokens.labels(*slo_key).inc(r.completion_tokens)

    def attempt_failed(self, model: str, attempt: AttemptRecord) -> None:
        """Add the part of a request that a worker failed, the request going on elsewhere
        (retried or migrated), to that worker's recent records now (not for a worker
        that left)."""
        if attempt.worker_id and (model, attempt.worker_id) not in self._gone:
            self.replicas.record_attempt(attempt)
            for listener in self.on_failed_attempt:
                listener(model, attempt.worker_id)

    # -- workers --

    def watch(self, model: str, workers: Callable[[], Iterable[WorkerView]]) -> None:
        """Export `model`'s per-worker snapshots from `workers()` at each scrape."""
        self._watched[model] = workers
        self.tracker(model)  # its SLO gauges exist from the start

    def forget_worker(self, model: str, worker: str) -> None:
        """`worker` left `model`'s pool: drop its records and labelled series."""
        self._gone[(model, worker)] = None
        while len(self._gone) > _GONE_KEPT:
            del self._gone[next(iter(self._gone))]
        self.replicas.forget(worker)
        if self.metrics is not None:
            self.metrics.forget_worker(model, worker)

    def snapshots(self, model: str) -> list[ReplicaSnapshot]:
        """The current snapshot of each of `model`'s watched workers."""
        workers = self._watched.get(model)
        if workers is None:
            return []
        return [self.replicas.snapshot(model, w) for w in workers()]

    # -- scrape time --

    def describe(self) -> Iterator[Metric]:
        """The scrape-time families (empty), for the registry's name check."""
        yield from _scrape_families().values()

    def collect(self) -> Iterator[Metric]:
        """SLO status per model and snapshot gauges per worker."""
        f = _scrape_families()
        models = sorted(set(self._trackers) | set(self._watched))
        for model in models:
            slo = self.slo(model)
            status = self.tracker(model).status()
            for window, _ in BURN_WINDOWS:
                f["burn"].add_metric([model, window], status.burn_rates[window])
            for severity, firing in status.alerts.items():
                f["alert"].add_metric([model, severity], 1.0 if firing else 0.0)
            f["attainment"].add_metric([model], status.attainment)
            f["goodput_rps"].add_metric([model], status.goodput_rps)
            f["goodput_tps"].add_metric([model], status.goodput_tps)
            f["objective"].add_metric([model], slo.objective)
            f["ttft"].add_metric([model], slo.rule_ttft_s)
            f["tpot"].add_metric([model], slo.rule_tpot_s)
            f["ttft_p95"].add_metric([model], slo.ttft_p95_s)
            f["tpot_p95"].add_metric([model], slo.tpot_p95_s)
            for s in self.snapshots(model):
                if self.metrics is not None:
                    self.metrics.start_version(model, s.version)
                labels = [model, s.worker_id]
                f["w_info"].add_metric([*labels, s.version, s.phase, s.state], 1.0)
                f["w_in_flight"].add_metric(labels, s.in_flight)
                f["w_healthy"].add_metric(labels, 1.0 if s.state == "ready" else 0.0)
                for name, value in (
                    ("w_running", s.running),
                    ("w_waiting", s.waiting),
                    ("w_kv", s.kv_usage),
                    ("w_hit", s.cache_hit_ratio),
                    ("w_ttft", s.ttft_per_uncached_token_s),
                    ("w_tpot", s.tpot_s),
                    ("w_errors", s.error_ratio),
                ):
                    if value is not None:
                        f[name].add_metric(labels, value)
        yield from f.values()


#: Ids of departed workers remembered (ids are never reused, so this only bounds memory).
_GONE_KEPT = 4096


class _NoGauge:
    def inc(self) -> None:
        pass

    def dec(self) -> None:
        pass


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def _scrape_families() -> dict[str, GaugeMetricFamily]:
    m, w = ["model"], ["model", "worker"]
    return {
        "burn": GaugeMetricFamily(
            "homing_slo_burn_rate",
            "Error-budget burn rate over the window: (missed + failed) / judged requests,"
            " over 1 - objective.",
            labels=["model", "window"],
        ),
        "alert": GaugeMetricFamily(
            "homing_slo_alert",
            "1 while the multiwindow burn-rate alert fires (page: 1h and 5m over 14.4;"
            " ticket: 6h and 30m over 6).",
            labels=["model", "severity"],
        ),
        "attainment": GaugeMetricFamily(
            "homing_slo_attainment_ratio",
            "Judged requests that met the SLO over the last 5 minutes (1 with none).",
            labels=m,
        ),
        "goodput_rps": GaugeMetricFamily(
            "homing_goodput_requests_per_second",
            "Requests/s that met the SLO, over the last 60 s.",
            labels=m,
        ),
        "goodput_tps": GaugeMetricFamily(
            "homing_goodput_tokens_per_second",
            "Completion tokens/s of requests that met the SLO, over the last 60 s.",
            labels=m,
        ),
        "objective": GaugeMetricFamily(
            "homing_slo_objective", "Fraction of requests that must meet the SLO.", labels=m
        ),
        "ttft": GaugeMetricFamily(
            "homing_slo_ttft_seconds", "The SLO's per-request TTFT limit.", labels=m
        ),
        "tpot": GaugeMetricFamily(
            "homing_slo_tpot_seconds", "The SLO's per-request TPOT limit.", labels=m
        ),
        "ttft_p95": GaugeMetricFamily(
            "homing_slo_ttft_p95_seconds", "The SLO's target for the p95 TTFT.", labels=m
        ),
        "tpot_p95": GaugeMetricFamily(
            "homing_slo_tpot_p95_seconds", "The SLO's target for the p95 TPOT.", labels=m
        ),
        "w_info": GaugeMetricFamily(
            "homing_worker_info",
            "1 per worker, its version label, lifecycle phase and state (ready, unhealthy, or"
            " the phase that keeps it from taking requests).",
            labels=[*w, "version", "phase", "state"],
        ),
        "w_in_flight": GaugeMetricFamily(
            "homing_worker_requests_in_flight", "Requests dispatched to the worker.", labels=w
        ),
        "w_healthy": GaugeMetricFamily(
            "homing_worker_healthy", "1 when the worker is ready and healthy.", labels=w
        ),
        "w_running": GaugeMetricFamily(
            "homing_worker_running_requests",
            "Requests the engine is running (its latest load record).",
            labels=w,
        ),
        "w_waiting": GaugeMetricFamily(
            "homing_worker_waiting_requests",
            "Requests waiting in the engine's queue (its latest load record).",
            labels=w,
        ),
        "w_kv": GaugeMetricFamily(
            "homing_worker_kv_usage_ratio",
            "The engine's KV-cache pool in use, 0 to 1 (its latest load record).",
            labels=w,
        ),
        "w_hit": GaugeMetricFamily(
            "homing_worker_cache_hit_ratio",
            "Cached / prompt tokens of the worker's requests over the last 60 s.",
            labels=w,
        ),
        "w_ttft": GaugeMetricFamily(
            "homing_worker_ttft_per_uncached_token_seconds",
            "Routing to first token per prompt token not served from cache, over the last 60 s.",
            labels=w,
        ),
        "w_tpot": GaugeMetricFamily(
            "homing_worker_tpot_seconds",
            "Time per output token after the first, over the last 60 s.",
            labels=w,
        ),
        "w_errors": GaugeMetricFamily(
            "homing_worker_error_ratio",
            "Requests the worker failed / its requests, over the last 60 s.",
            labels=w,
        ),
    }
