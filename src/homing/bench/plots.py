"""Pictures of bench runs: TTFT and TPOT CDFs, throughput and goodput, per-worker load and
cache hit rate over time, written as PNG files.

Rule of this file: the plotted series are pure functions of `RequestRecord`s; the drawing uses
`matplotlib.figure.Figure` objects directly (no pyplot, no global backend switch: `savefig`
renders PNGs with Agg). The definitions are `homing.bench.report`'s: TTFT and TPOT of completed
requests, `Slo.met_by` for goodput, cache hit rate = cached / prompt tokens of completed
requests. Times are the records' seconds from the start of the run; bin k covers
`[k * bin_s, (k + 1) * bin_s)` of end time and every rate in a bin is divided by the full
`bin_s` (the last bin of a run is usually partial, so its rates read low).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, PercentFormatter

from homing.bench.records import RequestRecord
from homing.bench.report import Slo, summarize

PLOT_FILES = ("ttft_cdf.png", "tpot_cdf.png", "throughput.png", "worker_load.png", "cache_hit.png")
"""The files `write_plots` and `write_comparison_plots` write, in this order."""

AUTO_BINS = 60
"""Most bins `auto_bin_s` gives over a run: fine enough to show bursts, coarse enough that a
bin of a ~1 req/s trace still holds a few requests."""

LOG_SPREAD = 100.0
"""A CDF's x axis turns logarithmic when max / min of the values and the SLO exceeds this."""

MAX_WORKER_LEGEND = 16
"""Worker-load figures name at most this many workers in their legend."""

DPI = 110
SLO_COLOR = "crimson"


# ============================================================================ series (pure)


def cdf(values: Iterable[float]) -> tuple[list[float], list[float]]:
    """Empirical CDF: the distinct finite values ascending, and the fraction of the finite
    values that are <= each. Non-finite values are dropped first; empty in, empty out."""
    finite = sorted(v for v in values if math.isfinite(v))
    n = len(finite)
    xs: list[float] = []
    ys: list[float] = []
    for i, v in enumerate(finite):
        if xs and xs[-1] == v:
            ys[-1] = (i + 1) / n
        else:
            xs.append(v)
            ys.append((i + 1) / n)
    return xs, ys


def fraction_at_most(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The CDF `(xs, ys)` of `cdf` evaluated at `x`: the fraction of values <= `x` (0 if none)."""
    i = bisect_right(xs, x)
    return ys[i - 1] if i else 0.0


def ttft_values_ms(records: Iterable[RequestRecord]) -> list[float]:
    """TTFT (ms) of each completed request, in record order (`report.summarize`'s samples)."""
    return [r.ttft_s * 1000.0 for r in records if r.completed and r.ttft_s is not None]


def tpot_values_ms(records: Iterable[RequestRecord]) -> list[float]:
    """TPOT (ms) of each completed request with >= 2 output tokens, in record order."""
    return [r.tpot_s * 1000.0 for r in records if r.completed and r.tpot_s is not None]


def auto_bin_s(span_s: float, target_bins: int = AUTO_BINS) -> float:
    """The smallest 1, 2 or 5 x 10^k seconds that cuts `[0, span_s]` into at most
    `target_bins` bins; 1.0 when `span_s` is not a finite number > 0."""
    if not (math.isfinite(span_s) and span_s > 0) or target_bins < 1:
        return 1.0
    raw = span_s / target_bins
    exp = math.floor(math.log10(raw))
    for mantissa in (1, 2, 5, 10):
        size = float(f"{mantissa}e{exp}")  # exact decimal, no 10**-k rounding drift
        if size >= raw:
            return size
    return float(f"1e{exp + 1}")


def _bin_range(ends: Iterable[float], bin_s: float) -> range:
    """Bin indices from min(0, first) to the last bin holding one of `ends`."""
    indices = [math.floor(t / bin_s) for t in ends]
    return range(min(0, *indices), max(indices) + 1) if indices else range(0)


def _check_bin(bin_s: float) -> None:
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise ValueError(f"bin_s must be a finite number > 0, got {bin_s}")


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-bin rates by end time: `starts[k]` (s) is bin k's start, the rest are per second.

    - `requests_per_s`: completed requests ending in the bin / `bin_s`;
    - `goodput_rps`: of those, the ones meeting the SLO (`Slo.met_by`) / `bin_s`;
    - `tokens_per_s`: completion tokens of those completed requests / `bin_s`.
    """

    bin_s: float
    starts: list[float]
    requests_per_s: list[float]
    goodput_rps: list[float]
    tokens_per_s: list[float]

    @property
    def edges(self) -> list[float]:
        """Bin edges (s): `starts` plus the end of the last bin; empty without bins."""
        return [*self.starts, self.starts[-1] + self.bin_s] if self.starts else []


def binned_rates(records: Iterable[RequestRecord], bin_s: float, slo: Slo) -> Rates:
    """Throughput, goodput and output tokens per second in bins of `bin_s` seconds of end time,
    over completed requests; every bin from 0 (or the earliest end) to the last is present.

    Raises ValueError unless `bin_s` is a finite number > 0.
    """
    _check_bin(bin_s)
    done = [r for r in records if r.completed and r.end_s is not None]
    bins = _bin_range((r.end_s for r in done if r.end_s is not None), bin_s)
    count = dict.fromkeys(bins, 0)
    good = dict.fromkeys(bins, 0)
    tokens = dict.fromkeys(bins, 0)
    for r in done:
        assert r.end_s is not None
        k = math.floor(r.end_s / bin_s)
        count[k] += 1
        good[k] += slo.met_by(r)
        tokens[k] += r.completion_tokens or 0
    return Rates(
        bin_s=bin_s,
        starts=[k * bin_s for k in bins],
        requests_per_s=[count[k] / bin_s for k in bins],
        goodput_rps=[good[k] / bin_s for k in bins],
        tokens_per_s=[tokens[k] / bin_s for k in bins],
    )


def hit_rate_series(
    records: Iterable[RequestRecord], bin_s: float
) -> tuple[list[float], list[float]]:
    """Cache hit rate per bin of end time: bin starts (s) and sum cached / sum prompt tokens
    of the completed requests ending in the bin. Bins without prompt tokens are left out (no
    NaN). Raises ValueError unless `bin_s` is a finite number > 0."""
    _check_bin(bin_s)
    prompt: dict[int, int] = defaultdict(int)
    cached: dict[int, int] = defaultdict(int)
    for r in records:
        if not r.completed or r.end_s is None:
            continue
        k = math.floor(r.end_s / bin_s)
        prompt[k] += r.prompt_tokens or 0
        cached[k] += r.cached_tokens or 0
    keys = sorted(k for k, p in prompt.items() if p > 0)
    return [k * bin_s for k in keys], [cached[k] / prompt[k] for k in keys]


def in_flight_series(
    records: Iterable[RequestRecord],
) -> dict[str, tuple[list[float], list[int]]]:
    """Requests in flight per worker as a step function: for each worker (sorted by name), the
    distinct times (s) at which a request was sent to it or ended, and the count in flight
    just after each. A request counts over `[send_s, end_s)`, failed ones included; records
    without a worker (no `x-homing-worker` header) or without send or end time are left out."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in records:
        if r.worker is None or r.send_s is None or r.end_s is None:
            continue
        events[r.worker].append((r.send_s, 1))
        events[r.worker].append((r.end_s, -1))
    out: dict[str, tuple[list[float], list[int]]] = {}
    for worker in sorted(events):
        times: list[float] = []
        counts: list[int] = []
        level = 0
        for t, delta in sorted(events[worker]):
            level += delta
            if times and times[-1] == t:
                counts[-1] = level
            else:
                times.append(t)
                counts.append(level)
        out[worker] = (times, counts)
    return out


# ============================================================================ drawing


def _style(i: int) -> dict[str, str]:
    """Colour (the default cycle C0..C9) and line style (cycling after 10) of series `i`."""
    return {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[(i // 10) % 3]}


def _no_data(ax: Axes, note: str = "no data") -> None:
    ax.text(
        0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", fontsize=12, color="0.4"
    )


def _label(name: str, text: str) -> str:
    return f"{name}: {text}" if name else text


def _cdf_figure(
    runs: Mapping[str, Sequence[RequestRecord]], slo_ms: float, metric: str, title: str
) -> Figure:
    values_of = ttft_values_ms if metric == "TTFT" else tpot_values_ms
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    every: list[float] = []
    for i, (name, records) in enumerate(runs.items()):
        xs, ys = cdf(values_of(records))
        if not xs:
            ax.plot([], [], label=_label(name, "no samples"), **_style(i))
            continue
        within = fraction_at_most(xs, ys, slo_ms)
        n = len(values_of(records))
        ax.step(
            [xs[0], *xs],
            [0.0, *ys],
            where="post",
            label=_label(name, f"{100 * within:.1f}% within SLO (n={n})"),
            **_style(i),
        )
        every.extend(xs)
    ax.axvline(slo_ms, color=SLO_COLOR, linestyle="--", label=f"SLO {metric} <= {slo_ms:g} ms")
    if not every:
        _no_data(ax, "no completed requests" if metric == "TTFT" else "no TPOT samples")
        ax.set_xlim(0.0, 1.25 * slo_ms)  # the SLO line clear of the note
    else:
        lo = min(*every, slo_ms)
        hi = max(*every, slo_ms)
        if lo > 0 and hi / lo > LOG_SPREAD:
            ax.set_xscale("log")
    ax.set_ylim(0.0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(f"{metric} (ms){', log scale' if ax.get_xscale() == 'log' else ''}")
    ax.set_ylabel("completed requests at or below (CDF)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.suptitle(f"{title}: {metric} CDF")
    return fig


def _columns(n: int) -> float:
    return max(8.0, 4.5 * n)


def _throughput_figure(
    runs: Mapping[str, Sequence[RequestRecord]], slo: Slo, bin_s: float, title: str
) -> Figure:
    fig = Figure(figsize=(_columns(len(runs)), 7), layout="constrained")
    axes = fig.subplots(2, len(runs), sharex=True, sharey="row", squeeze=False)
    drawn = False
    for col, (name, records) in enumerate(runs.items()):
        top, bottom = axes[0][col], axes[1][col]
        rates = binned_rates(records, bin_s, slo)
        summary = summarize(records, slo=slo)
        if rates.starts:
            edges = rates.edges
            top.stairs(rates.requests_per_s, edges, label="throughput (completed req/s)", lw=1.5)
            top.stairs(rates.goodput_rps, edges, label="goodput (req/s within SLO)", lw=1.5)
            bottom.stairs(rates.tokens_per_s, edges, label="output tokens/s", color="C2", lw=1.5)
            if not drawn:
                handles = [
                    *top.get_legend_handles_labels()[0],
                    *bottom.get_legend_handles_labels()[0],
                ]
                fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize="small")
            drawn = True
        else:
            _no_data(top, "no completed requests")
            _no_data(bottom, "no completed requests")
        good = summary["goodput_rps"]
        attained = summary["slo_attainment"]
        head = "" if good is None else f"goodput {good:.3g} req/s"
        if attained is not None:
            head += f", {100 * attained:.1f}% within SLO"
        top.set_title("\n".join(t for t in (name, head) if t), fontsize="medium")
        bottom.set_xlabel(f"time since start (s), {bin_s:g} s bins by end time")
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("requests/s")
    axes[1][0].set_ylabel("output tokens/s")
    for ax in axes[:, 0]:
        ax.set_ylim(bottom=0.0)  # after every column is drawn: the shared top fits them all
    fig.suptitle(
        f"{title}: throughput and goodput\n"
        f"SLO TTFT <= {slo.ttft_ms:g} ms, TPOT <= {slo.tpot_ms:g} ms"
    )
    return fig


def _worker_load_figure(runs: Mapping[str, Sequence[RequestRecord]], title: str) -> Figure:
    series = {name: in_flight_series(records) for name, records in runs.items()}
    workers = sorted({w for per in series.values() for w in per})
    index = {w: i for i, w in enumerate(workers)}
    fig = Figure(figsize=(_columns(len(runs)), 5), layout="constrained")
    axes = fig.subplots(1, len(runs), sharex=True, sharey=True, squeeze=False)[0]
    for ax, (name, per) in zip(axes, series.items(), strict=True):
        for worker, (times, counts) in per.items():
            ax.step(
                [times[0], *times],
                [0, *counts],
                where="post",
                label=worker,
                lw=0.9,
                **_style(index[worker]),
            )
        if not per:
            _no_data(ax, "no requests with a worker")
        if name:
            ax.set_title(name, fontsize="medium")
        ax.set_xlabel("time since start (s)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("requests in flight per worker")
    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylim(bottom=0.0)  # after every column is drawn: the shared top fits them all
    if workers and len(workers) <= MAX_WORKER_LEGEND:
        handles = [Line2D([], [], label=w, lw=1.5, **_style(index[w])) for w in workers]
        fig.legend(handles=handles, loc="outside right upper", fontsize="small", title="worker")
    fig.suptitle(f"{title}: load per worker")
    return fig


def _cache_hit_figure(
    runs: Mapping[str, Sequence[RequestRecord]], slo: Slo, bin_s: float, title: str
) -> Figure:
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    drawn = False
    for i, (name, records) in enumerate(runs.items()):
        starts, rates = hit_rate_series(records, bin_s)
        overall = summarize(records, slo=slo)["cache_hit_rate"]
        if not starts or overall is None:
            ax.plot([], [], label=_label(name, "no prompt tokens"), **_style(i))
            continue
        centres = [s + bin_s / 2 for s in starts]
        marker = "o" if len(starts) <= 30 else None
        label = _label(name, f"{100 * overall:.1f}% overall")
        ax.plot(centres, rates, marker=marker, markersize=3, label=label, **_style(i))
        drawn = True
    if not drawn:
        _no_data(ax, "no completed requests")
    ax.set_ylim(0.0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel(f"time since start (s), {bin_s:g} s bins by end time")
    ax.set_ylabel("cache hit rate (cached / prompt tokens)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.suptitle(f"{title}: prefix cache hit rate")
    return fig


def write_comparison_plots(
    runs: Mapping[str, Sequence[RequestRecord]],
    out_dir: str | Path,
    slo: Slo,
    *,
    title: str = "homing bench",
    bin_s: float | None = None,
) -> list[Path]:
    """Write the five `PLOT_FILES` into `out_dir` (created) comparing `runs` (name -> records):
    CDFs and the hit rate with one line per run, throughput and worker load with one column
    per run (shared y axes). `bin_s` None picks `auto_bin_s` over the latest end of any run,
    the same bins for every run. Runs without completed requests are drawn with a "no data"
    note. Returns the paths in `PLOT_FILES` order.

    Raises ValueError when `runs` is empty or `bin_s` is not a finite number > 0; OSError when
    `out_dir` cannot be created or written.
    """
    if not runs:
        raise ValueError("write_comparison_plots needs at least one run")
    runs = {name: list(records) for name, records in runs.items()}
    if bin_s is None:
        ends = [r.end_s for records in runs.values() for r in records if r.end_s is not None]
        bin_s = auto_bin_s(max(ends) if ends else 0.0)
    _check_bin(bin_s)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    makers = (
        lambda: _cdf_figure(runs, slo.ttft_ms, "TTFT", title),
        lambda: _cdf_figure(runs, slo.tpot_ms, "TPOT", title),
        lambda: _throughput_figure(runs, slo, bin_s, title),
        lambda: _worker_load_figure(runs, title),
        lambda: _cache_hit_figure(runs, slo, bin_s, title),
    )
    paths: list[Path] = []
    for name, make in zip(PLOT_FILES, makers, strict=True):
        path = out / name
        make().savefig(path, format="png", dpi=DPI)
        paths.append(path)
    return paths


def write_plots(
    records: Sequence[RequestRecord],
    out_dir: str | Path,
    slo: Slo,
    *,
    title: str = "homing bench",
    bin_s: float | None = None,
) -> list[Path]:
    """Write the five `PLOT_FILES` of one run into `out_dir` (created); see
    `write_comparison_plots` for bins, empty data and errors. Returns the paths."""
    return write_comparison_plots({"": records}, out_dir, slo, title=title, bin_s=bin_s)
