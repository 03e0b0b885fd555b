"""The pure part of `homing top`: scrapes of a gateway's `/metrics` in, one frame of per-model,
per-version and per-worker rows out.

`parse_scrape(text, at)` turns a Prometheus text exposition (prometheus-client's parser) taken
at monotonic second `at` into a `Scrape`. A `Window` keeps the scrapes of the last `span_s`
seconds; its `frame()` computes, over the oldest and newest scrape it holds:

- rates (requests/s, output tokens/s) from the counters' increase, per series: a series absent
  from the oldest scrape was created after it and counts from 0; one whose value went down was
  reset (the gateway restarted) and counts from 0 too (Prometheus' `increase` rule, without its
  extrapolation to the window's edges); a version's error share and SLO attainment from the
  increases of its SLO verdict counter the same way;
- quantiles (TTFT p50/p95, TPOT p95) from the histograms' bucket increases over the window,
  summed over the other labels (version, tenant; worker for a model's or a version's row), with
  `histogram_quantile`, Prometheus' linear interpolation within the bucket;
- gauges (in-flight, queue, KV use, hit rate, SLO attainment, goodput, burn rates, alerts,
  version weights, rollout phases) from the newest scrape.

Versions: a model gets one row per version label (`VersionRow`) when the newest scrape shows
more than one for it, the empty label "" counting as one (`_Reader.versions` says where the
labels come from).

Metric names are the gateway's (`homing.obs`, `homing.rollout.metrics`). Anything missing is
None, never an error: a gauge or histogram with no series, a counter whose family the gateway
does not declare, and every windowed figure until the window holds two scrapes. A counter
family that is declared but has no series for the row (no request yet) gives a rate of 0.
Workers are those with per-worker gauges in the newest scrape: a worker that left is not shown
(the gateway drops every series labelled with it).
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
"""One series' labels as (name, value) pairs."""

#: Gauges {model, worker} that exist exactly while the worker is in the pool: the newest
#: scrape's workers are those with at least one of them. (Counters, histograms and the
#: in-flight gauge keep a series of a worker that left.)
WORKER_GAUGES = (
    "homing_worker_healthy",
    "homing_worker_running_requests",
    "homing_worker_waiting_requests",
    "homing_worker_kv_usage_ratio",
    "homing_worker_cache_hit_ratio",
    "homing_worker_ttft_per_uncached_token_seconds",
    "homing_worker_tpot_seconds",
    "homing_worker_error_ratio",
    "homing_router_index_blocks",
    "homing_router_kv_stream_up",
    "homing_router_worker_mode",
)

#: The per-worker info gauge {model, worker, version, phase, state} (1 per worker): its
#: lifecycle phase is read from it; a gateway that does not export it shows no phase.
WORKER_PHASE = "homing_worker_info"

#: Request series {model, version, worker, ...} whose version labels, on series of a routed
#: request (non-empty worker), are a model's versions.
VERSION_REQUEST_SERIES = (
    "homing_requests_total",
    "homing_request_ttft_seconds_bucket",
    "homing_request_tpot_seconds_bucket",
)
#: Each version's share of new sessions under the model's split {model, version}, percent
#: (no series for a model without a split).
VERSION_WEIGHT = "homing_version_weight"
#: 1 for the current phase of a rollout {model, canary, phase}, 0 for the other phases.
ROLLOUT_PHASE = "homing_rollout_phase"


class MetricsTextError(ValueError):
    """The text is not a Prometheus exposition of a homing gateway."""


@dataclass(frozen=True)
class Scrape:
    """One `/metrics` text taken at monotonic second `at`.

    `samples`: sample name (`homing_requests_total`, `homing_request_ttft_seconds_bucket`, ...)
    -> labels -> value; the `_created` samples are left out. `families`: the declared family
    names (counters without `_total`), including those with no series yet.
    """

    at: float
    samples: Mapping[str, Mapping[Labels, float]]
    families: frozenset[str]

    def series(self, name: str, want: Labels = frozenset()) -> dict[Labels, float]:
        """The series of sample `name` whose labels include `want`."""
        return {k: v for k, v in self.samples.get(name, {}).items() if want <= k}


def parse_scrape(text: str, at: float) -> Scrape:
    """`text` (Prometheus text format) taken at monotonic second `at`; raises
    `MetricsTextError` when it does not parse or declares no `homing_` family."""
    samples: dict[str, dict[Labels, float]] = {}
    families: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            families.add(family.name)
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = float(
                    sample.value
                )
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise MetricsTextError(f"not Prometheus metrics text ({err})") from err
    if not any(name.startswith("homing_") for name in families):
        raise MetricsTextError("no homing metrics in it")
    return Scrape(at=at, samples=samples, families=frozenset(families))


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The `q`-quantile (0 <= q <= 1) of cumulative `buckets`, (upper bound, count) pairs in
    any order, by Prometheus' `histogram_quantile` rule: find the bucket whose count reaches
    rank `q * total` and interpolate linearly between its lower and upper bound (the lowest
    bucket's lower bound is 0); a rank in the +Inf bucket gives the highest finite bound.
    Counts that go down are raised to the count before them (Prometheus does the same).
    None where Prometheus gives NaN: no observations, fewer than two buckets, no +Inf
    bucket. Raises ValueError for q outside [0, 1]."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    ordered = sorted(buckets)
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return None
    bounds = [bound for bound, _ in ordered]
    counts: list[float] = []
    for _, count in ordered:
        counts.append(max(count, counts[-1]) if counts else count)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next((i for i in range(len(counts) - 1) if counts[i] >= rank), len(counts) - 1)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, below = (bounds[b - 1], counts[b - 1]) if b > 0 else (0.0, 0.0)
    in_bucket = counts[b] - below
    if in_bucket <= 0:
        return start
    return start + (bounds[b] - start) * ((rank - below) / in_bucket)


@dataclass(frozen=True)
class ModelRow:
    """One served model. Rates are per second over the window; latencies in seconds; ratios
    0..1. `workers`: phase -> workers in it (`homing_workers`); `alerts`: the SLO alert
    severities firing ("page", "ticket"), [] when none."""

    model: str
    workers: dict[str, int] | None
    requests_per_second: float | None
    output_tokens_per_second: float | None
    in_flight: float | None
    queued: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    goodput_requests_per_second: float | None
    attainment_ratio: float | None
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    slo_objective: float | None
    burn_rate_1h: float | None
    burn_rate_5m: float | None
    alerts: list[str] | None


@dataclass(frozen=True)
class WorkerRow:
    """One worker of a model. `state`: "healthy" or "unhealthy" (`homing_worker_healthy`);
    `phase`: its lifecycle phase where the gateway exports one per worker."""

    model: str
    worker: str
    state: str | None
    phase: str | None
    requests_per_second: float | None
    ttft_p95_s: float | None
    in_flight: float | None
    running: float | None
    waiting: float | None
    kv_usage_ratio: float | None
    cache_hit_ratio: float | None


@dataclass(frozen=True)
class VersionRow:
    """One version of a model that has several. `version` "": workers without a label (the
    row's requests include the model's refusals before routing, which carry ""). Gauges:
    `weight_percent`, its share of new sessions under the split, 0..100
    (`homing_version_weight`; None without a split); `rollout`, the phase ("running",
    "paused", "promoted", "rolled_back") of the model's rollout with this version as canary,
    None without one (`homing_rollout_phase`). Over the window: `requests_per_second`
    (`homing_requests_total`, every outcome); `error_ratio` (failed / judged) and
    `attainment_ratio` (met / judged), 0..1 from the increases of `homing_slo_requests_total`
    (None with no judged request in the window); `ttft_p95_s`, `tpot_p95_s` in seconds."""

    model: str
    version: str
    weight_percent: float | None
    requests_per_second: float | None
    error_ratio: float | None
    attainment_ratio: float | None
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    rollout: str | None


@dataclass(frozen=True)
class Frame:
    """What one refresh shows. `window_s`: seconds between the oldest and the newest scrape
    the windowed figures span (None with one scrape); `scrapes`: how many the window holds;
    `versions`: the version rows of the models with several versions ([] when none has)."""

    window_s: float | None
    scrapes: int
    models: list[ModelRow]
    workers: list[WorkerRow]
    versions: list[VersionRow]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready data: these fields, rows as objects with every field (None as null)."""
        return asdict(self)


def _labels(**want: str) -> Labels:
    return frozenset(want.items())


def _clean(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


class _Reader:
    """Figures of the oldest (`first`) and newest (`last`) scrape of a window; `first` is
    None with a single scrape."""

    def __init__(self, first: Scrape | None, last: Scrape) -> None:
        self.first = first
        self.last = last
        self.span = None if first is None else last.at - first.at

    def gauge_sum(self, name: str, want: Labels, zero_if_declared: bool = False) -> float | None:
        """The sum of the matching series of gauge `name` (None when none; 0 when none but
        the family is declared and `zero_if_declared`)."""
        found = self.last.series(name, want)
        if not found:
            return 0.0 if zero_if_declared and name in self.last.families else None
        return _clean(sum(found.values()))

    def gauge_max(self, name: str, want: Labels) -> float | None:
        """The largest of the matching series of gauge `name` (an engine's own count, which
        every gateway process reports); None when none."""
        found = self.last.series(name, want)
        return _clean(max(found.values())) if found else None

    def gauge_mean(self, name: str, want: Labels) -> float | None:
        """The mean of the matching series of gauge `name` (ratios); None when none."""
        found = self.last.series(name, want)
        return _clean(sum(found.values()) / len(found)) if found else None

    def _increases(self, name: str, want: Labels) -> dict[Labels, float]:
        assert self.first is not None
        before = self.first.series(name, want)
        out: dict[Labels, float] = {}
        for labels, value in self.last.series(name, want).items():
            old = before.get(labels)
            out[labels] = value if old is None or value < old else value - old
        return out

    def rate(self, family: str, want: Labels) -> float | None:
        """Per-second increase of counter `family` (samples `family_total`) over the window,
        summed over the matching series; None without a window or a declared family."""
        name = family + "_total"
        declared = {family, name} & self.last.families  # typed or untyped exposition
        if self.span is None or self.span <= 0 or not declared:
            return None
        return sum(self._increases(name, want).values()) / self.span

    def quantile(self, q: float, family: str, want: Labels) -> float | None:
        """The `q`-quantile of histogram `family`'s observations in the window, over the
        matching series; None without a window or without observations in it."""
        if self.span is None:
            return None
        per_bound: dict[float, float] = {}
        for labels, delta in self._increases(family + "_bucket", want).items():
            bound = _bound(dict(labels).get("le"))
            if bound is not None:
                per_bound[bound] = per_bound.get(bound, 0.0) + delta
        return histogram_quantile(q, list(per_bound.items()))

    def increase(self, family: str, want: Labels) -> float | None:
        """The increase of counter `family` (samples `family_total`) over the window, summed
        over the matching series; None without a window."""
        if self.span is None:
            return None
        return sum(self._increases(family + "_total", want).values())

    def versions(self, model: str) -> list[str]:
        """`model`'s version labels in the newest scrape, "" first, then sorted with digits
        as numbers: those of routed requests (`VERSION_REQUEST_SERIES` with a worker), of its
        workers (`homing_worker_info`) and of its split (`homing_version_weight`)."""
        found: set[str] = set()
        for name in VERSION_REQUEST_SERIES:
            for labels in self.last.samples.get(name, {}):
                tags = dict(labels)
                if tags.get("model") == model and tags.get("worker") and "version" in tags:
                    found.add(tags["version"])
        for name in (WORKER_PHASE, VERSION_WEIGHT):
            for labels in self.last.samples.get(name, {}):
                tags = dict(labels)
                if tags.get("model") == model and "version" in tags:
                    found.add(tags["version"])
        return sorted(found, key=_natural)

    def models(self) -> list[str]:
        """Every non-empty `model` label of the newest scrape, sorted."""
        found = {
            value
            for series in self.last.samples.values()
            for labels in series
            for key, value in labels
            if key == "model" and value
        }
        return sorted(found)

    def workers(self) -> list[tuple[str, str]]:
        """(model, worker) of every worker with a per-worker gauge in the newest scrape,
        sorted by model, then by worker id with its digits as numbers (w2 before w10)."""
        found: set[tuple[str, str]] = set()
        for name in WORKER_GAUGES:
            for labels in self.last.samples.get(name, {}):
                tags = dict(labels)
                if tags.get("model") and tags.get("worker"):
                    found.add((tags["model"], tags["worker"]))
        return sorted(found, key=lambda mw: (mw[0], _natural(mw[1])))


def _bound(le: str | None) -> float | None:
    """A bucket's upper bound from its `le` label ("0.5", "+Inf"); None when malformed."""
    try:
        return None if le is None else float(le)
    except ValueError:
        return None


def _label_values(series: Mapping[Labels, float], name: str, at_least: float) -> dict[str, float]:
    """Label `name`'s value -> the series' value, for the series that have the label and a
    value of at least `at_least`."""
    out: dict[str, float] = {}
    for labels, value in series.items():
        tag = dict(labels).get(name)
        if tag is not None and value >= at_least:
            out[tag] = value
    return out


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p)


def _model_row(r: _Reader, model: str) -> ModelRow:
    m = _labels(model=model)
    phases = r.last.series("homing_workers", m)
    workers = {p: int(n) for p, n in _label_values(phases, "phase", 1).items()}
    alerts = r.last.series("homing_slo_alert", m)
    return ModelRow(
        model=model,
        workers=dict(sorted(workers.items())) if phases else None,
        requests_per_second=r.rate("homing_requests", m),
        output_tokens_per_second=r.rate("homing_generation_tokens", m),
        in_flight=r.gauge_sum("homing_requests_in_flight", m, zero_if_declared=True),
        queued=r.gauge_sum("homing_admission_queue_depth", m, zero_if_declared=True),
        ttft_p50_s=r.quantile(0.5, "homing_request_ttft_seconds", m),
        ttft_p95_s=r.quantile(0.95, "homing_request_ttft_seconds", m),
        tpot_p95_s=r.quantile(0.95, "homing_request_tpot_seconds", m),
        goodput_requests_per_second=r.gauge_sum("homing_goodput_requests_per_second", m),
        attainment_ratio=r.gauge_mean("homing_slo_attainment_ratio", m),
        slo_ttft_s=r.gauge_mean("homing_slo_ttft_seconds", m),
        slo_tpot_s=r.gauge_mean("homing_slo_tpot_seconds", m),
        slo_objective=r.gauge_mean("homing_slo_objective", m),
        burn_rate_1h=r.gauge_mean("homing_slo_burn_rate", _labels(model=model, window="1h")),
        burn_rate_5m=r.gauge_mean("homing_slo_burn_rate", _labels(model=model, window="5m")),
        alerts=(
            sorted(_label_values(alerts, "severity", 1))
            if alerts or "homing_slo_alert" in r.last.families
            else None
        ),
    )


def _worker_row(r: _Reader, model: str, worker: str) -> WorkerRow:
    w = _labels(model=model, worker=worker)
    healthy = r.gauge_mean("homing_worker_healthy", w)
    phases = list(_label_values(r.last.series(WORKER_PHASE, w), "phase", 1))
    return WorkerRow(
        model=model,
        worker=worker,
        state=None if healthy is None else ("healthy" if healthy >= 1 else "unhealthy"),
        phase=phases[0] if len(phases) == 1 else None,
        requests_per_second=r.rate("homing_requests", w),
        ttft_p95_s=r.quantile(0.95, "homing_request_ttft_seconds", w),
        in_flight=r.gauge_sum("homing_worker_requests_in_flight", w, zero_if_declared=True),
        running=r.gauge_max("homing_worker_running_requests", w),
        waiting=r.gauge_max("homing_worker_waiting_requests", w),
        kv_usage_ratio=r.gauge_mean("homing_worker_kv_usage_ratio", w),
        cache_hit_ratio=r.gauge_mean("homing_worker_cache_hit_ratio", w),
    )


def _ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or whole is None or whole <= 0 else part / whole


def _version_row(r: _Reader, model: str, version: str) -> VersionRow:
    v = _labels(model=model, version=version)
    judged = r.increase("homing_slo_requests", v)
    failed = r.increase("homing_slo_requests", v | _labels(verdict="failed"))
    met = r.increase("homing_slo_requests", v | _labels(verdict="met"))
    canary = r.last.series(ROLLOUT_PHASE, _labels(model=model, canary=version))
    phases = sorted(_label_values(canary, "phase", 1))
    return VersionRow(
        model=model,
        version=version,
        weight_percent=r.gauge_mean(VERSION_WEIGHT, v),
        requests_per_second=r.rate("homing_requests", v),
        error_ratio=_ratio(failed, judged),
        attainment_ratio=_ratio(met, judged),
        ttft_p95_s=r.quantile(0.95, "homing_request_ttft_seconds", v),
        tpot_p95_s=r.quantile(0.95, "homing_request_tpot_seconds", v),
        rollout=phases[0] if len(phases) == 1 else None,
    )


def compute_frame(scrapes: Sequence[Scrape]) -> Frame:
    """The frame of `scrapes` (oldest first; at least one): windowed figures over the first
    and the last, gauges and the rows' models and workers from the last."""
    if not scrapes:
        raise ValueError("a frame needs at least one scrape")
    r = _Reader(scrapes[0] if len(scrapes) > 1 else None, scrapes[-1])
    models = r.models()
    versions = {model: r.versions(model) for model in models}
    return Frame(
        window_s=r.span,
        scrapes=len(scrapes),
        models=[_model_row(r, model) for model in models],
        workers=[_worker_row(r, model, worker) for model, worker in r.workers()],
        versions=[
            _version_row(r, model, version)
            for model in models
            if len(versions[model]) > 1
            for version in versions[model]
        ],
    )


class Window:
    """The scrapes of the last `span_s` seconds (default 30): adding one drops the oldest
    while more than two are held and the oldest is over `span_s` older than the newest (so
    a window always spans its two newest scrapes, even when they are further apart)."""

    def __init__(self, span_s: float = 30.0, scrapes: Iterable[Scrape] = ()) -> None:
        if not span_s > 0:
            raise ValueError(f"window span must be > 0 s, not {span_s}")
        self.span_s = span_s
        self._scrapes: deque[Scrape] = deque()
        for scrape in scrapes:
            self.add(scrape)

    def __len__(self) -> int:
        return len(self._scrapes)

    def add(self, scrape: Scrape) -> None:
        """Add the newest scrape; raises ValueError if it is older than the newest held."""
        if self._scrapes and scrape.at < self._scrapes[-1].at:
            raise ValueError("scrapes must be added oldest first")
        self._scrapes.append(scrape)
        while len(self._scrapes) > 2 and scrape.at - self._scrapes[0].at > self.span_s:
            self._scrapes.popleft()

    def frame(self) -> Frame:
        """The frame of the scrapes held (at least one must have been added)."""
        return compute_frame(list(self._scrapes))
