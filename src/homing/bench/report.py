"""Benchmark summary: records in, a JSON-ready dict and a plain-text table out.

Rule of this file: pure arithmetic over `RequestRecord`s; no clock, no files. Definitions (names
from docs/architecture.md, "Terms"):

- TTFT = first chunk with text - send time (queueing for a concurrency slot excluded; it is
  reported separately as `queue_delay_ms`). TPOT = (last token - first token) /
  (completion_tokens - 1), only for completed requests with completion_tokens >= 2.
- percentiles: linear interpolation between closest ranks (Hyndman & Fan type 7, numpy's
  default `method="linear"`); None when there are no samples.
- a request meets the SLO when it completed, its TTFT <= `ttft_ms` and its TPOT <= `tpot_ms`
  (a request with fewer than 2 output tokens has no TPOT and meets that half).
- `goodput_rps` = requests meeting the SLO / `duration_s`; `slo_attainment` = requests meeting
  the SLO / all requests (errors count as misses).
- `duration_s` = last end - first send; `throughput_tokens_per_s` = completion tokens of the
  completed requests / `duration_s`.
- `cache_hit_rate` = sum cached_tokens / sum prompt_tokens over completed requests (usage
  counts).
- `queue_delay_ms` = send - trace arrival / speed: the wait for a `--concurrency` slot plus the
  client's own lateness (prompt construction, event-loop lag); it is not part of TTFT.

JSON numbers are rounded: ms to 3 decimals, ratios and rates to 6, seconds and tokens/s to 3.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from homing.bench.records import RequestRecord

DEFAULT_SLO_TTFT_MS = 2000.0
"""Default TTFT SLO (ms): interactive chat tolerance, the seed's chat answers use 2 s."""

DEFAULT_SLO_TPOT_MS = 50.0
"""Default TPOT SLO (ms): 20 tokens/s per stream, the p95 TPOT target of the sizing chain
(docs/architecture.md, "The sizing chain")."""

ERROR_SAMPLES = 5
"""How many failed requests the summary lists verbatim."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Service-level objective per request: TTFT and TPOT bounds in ms."""

    ttft_ms: float = DEFAULT_SLO_TTFT_MS
    tpot_ms: float = DEFAULT_SLO_TPOT_MS

    def met_by(self, record: RequestRecord) -> bool:
        """True when `record` completed within both bounds (no TPOT counts as within)."""
        if not record.completed or record.ttft_s is None:
            return False
        if record.ttft_s * 1000.0 > self.ttft_ms:
            return False
        tpot = record.tpot_s
        return tpot is None or tpot * 1000.0 <= self.tpot_ms


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0..100) of `values`, linear interpolation (type 7); None if empty.

    Raises ValueError for q outside [0, 100].
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def distribution(values: Sequence[float], digits: int = 3) -> dict[str, float | None]:
    """`{"p50", "p95", "p99", "mean", "max"}` of `values` (same unit), None values if empty.

    Rounded to `digits` decimals (3 for ms = microsecond resolution, far below clock jitter).
    """
    return {
        "p50": _round(percentile(values, 50), digits),
        "p95": _round(percentile(values, 95), digits),
        "p99": _round(percentile(values, 99), digits),
        "mean": _round(sum(values) / len(values), digits) if values else None,
        "max": _round(max(values), digits) if values else None,
    }


def _ratio(num: float, den: float, digits: int = 6) -> float | None:
    return round(num / den, digits) if den > 0 else None


def summarize(
    records: Sequence[RequestRecord],
    *,
    slo: Slo,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The benchmark summary as a JSON-ready dict.

    `meta` (trace, format, speed, limit, concurrency, model, url, started_at, ...) is copied in
    first. Keys: requests, completed, errors, errors_by_kind, error_samples, slo, ttft_ms,
    tpot_ms, queue_delay_ms, latency_ms (each p50/p95/p99/mean/max in ms), cache_hit_rate,
    goodput_rps, slo_attainment, duration_s, throughput_tokens_per_s, request_throughput_rps,
    prompt_tokens, cached_tokens, completion_tokens, per_worker. Ratios with a zero
    denominator are None. `per_worker` groups by the `x-homing-worker` header (requests without
    it, e.g. refused connections, are left out): requests, completed, errors, prompt_tokens,
    cached_tokens, completion_tokens (token sums over completed requests), cache_hit_rate.
    """
    completed = [r for r in records if r.completed]
    failed = [r for r in records if not r.completed]
    ttft = [r.ttft_s * 1000.0 for r in completed if r.ttft_s is not None]
    tpot = [r.tpot_s * 1000.0 for r in completed if r.tpot_s is not None]
    queue = [r.queue_delay_s * 1000.0 for r in records if r.queue_delay_s is not None]
    latency = [
        (r.end_s - r.send_s) * 1000.0
        for r in completed
        if r.end_s is not None and r.send_s is not None
    ]
    sends = [r.send_s for r in records if r.send_s is not None]
    ends = [r.end_s for r in records if r.send_s is not None and r.end_s is not None]
    duration = max(ends) - min(sends) if sends and ends else 0.0
    prompt = sum(r.prompt_tokens or 0 for r in completed)
    cached = sum(r.cached_tokens or 0 for r in completed)
    output = sum(r.completion_tokens or 0 for r in completed)
    good = sum(1 for r in records if slo.met_by(r))

    summary: dict[str, Any] = dict(meta or {})
    summary.update(
        {
            "requests": len(records),
            "completed": len(completed),
            "errors": len(failed),
            "errors_by_kind": dict(Counter(r.error_kind or "unfinished" for r in failed)),
            "error_samples": [
                {
                    "index": r.index,
                    "status": r.status,
                    "worker": r.worker,
                    "kind": r.error_kind,
                    "error": r.error,
                }
                for r in failed[:ERROR_SAMPLES]
            ],
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
            "ttft_ms": distribution(ttft),
            "tpot_ms": distribution(tpot),
            "queue_delay_ms": distribution(queue),
            "latency_ms": distribution(latency),
            "cache_hit_rate": _ratio(cached, prompt),
            "goodput_rps": _ratio(good, duration),
            "slo_attainment": _ratio(good, len(records)),
            "duration_s": round(duration, 3),
            "throughput_tokens_per_s": _ratio(output, duration, 3),
            "request_throughput_rps": _ratio(len(completed), duration),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": output,
            "per_worker": _per_worker(records),
        }
    )
    return summary


def _per_worker(records: Sequence[RequestRecord]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.worker is None:
            continue
        w = out.setdefault(
            r.worker,
            {
                "requests": 0,
                "completed": 0,
                "errors": 0,
                "prompt_tokens": 0,
                "cached_tokens": 0,
                "completion_tokens": 0,
            },
        )
        w["requests"] += 1
        if r.completed:
            w["completed"] += 1
            w["prompt_tokens"] += r.prompt_tokens or 0
            w["cached_tokens"] += r.cached_tokens or 0
            w["completion_tokens"] += r.completion_tokens or 0
        else:
            w["errors"] += 1
    for w in out.values():
        w["cache_hit_rate"] = _ratio(w["cached_tokens"], w["prompt_tokens"])
    return dict(sorted(out.items()))


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def format_summary(summary: Mapping[str, Any]) -> str:
    """A plain-text table of a `summarize` result (for a terminal; no colours)."""
    lines: list[str] = []
    head = [f"trace {summary.get('trace', '-')}"]
    for key in ("format", "model", "speed", "limit", "concurrency"):
        if key in summary:
            head.append(f"{key} {summary[key]}")
    lines.append("homing bench: " + "  ".join(head))
    if summary.get("interrupted"):
        lines.append("INTERRUPTED: the run was stopped early; figures cover the sent requests")
    lines.append(
        f"requests {summary['requests']}  completed {summary['completed']}  "
        f"errors {summary['errors']}"
    )
    slo = summary["slo"]
    lines.append(
        f"duration {_num(summary['duration_s'], 2)} s  "
        f"output {_num(summary['throughput_tokens_per_s'])} tok/s  "
        f"goodput {_num(summary['goodput_rps'], 2)} req/s  "
        f"SLO attainment {_pct(summary['slo_attainment'])} "
        f"(TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms)"
    )
    lines.append(
        f"cache hit rate {_pct(summary['cache_hit_rate'])}  "
        f"(cached {summary['cached_tokens']:,} of {summary['prompt_tokens']:,} prompt tokens)"
    )
    lines.append("")
    cols = ("p50", "p95", "p99", "mean", "max")
    lines.append(f"{'':<16}" + "".join(f"{c:>11}" for c in cols))
    for key, label in (
        ("ttft_ms", "TTFT ms"),
        ("tpot_ms", "TPOT ms"),
        ("queue_delay_ms", "queue delay ms"),
        ("latency_ms", "latency ms"),
    ):
        dist = summary[key]
        lines.append(f"{label:<16}" + "".join(f"{_num(dist[c]):>11}" for c in cols))
    per_worker = summary["per_worker"]
    if per_worker:
        lines.append("")
        wcols = ("requests", "errors", "prompt_tokens", "cached_tokens", "hit rate")
        width = max(8, *(len(w) for w in per_worker))
        lines.append(f"{'worker':<{width}}" + "".join(f"{c:>15}" for c in wcols))
        for worker, w in per_worker.items():
            cells = (
                f"{w['requests']:,}",
                f"{w['errors']:,}",
                f"{w['prompt_tokens']:,}",
                f"{w['cached_tokens']:,}",
                _pct(w["cache_hit_rate"]),
            )
            lines.append(f"{worker:<{width}}" + "".join(f"{c:>15}" for c in cells))
    if summary["errors"]:
        lines.append("")
        kinds = ", ".join(f"{k} {n}" for k, n in summary["errors_by_kind"].items())
        lines.append(f"errors by kind: {kinds}")
        for s in summary["error_samples"]:
            where = f" worker {s['worker']}" if s["worker"] else ""
            lines.append(f"  request {s['index']} (status {s['status']}{where}): {s['error']}")
    return "\n".join(lines)
