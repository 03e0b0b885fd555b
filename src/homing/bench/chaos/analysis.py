"""Pure summary of one chaos scenario: request records and fault windows in, figures and
checks out.

Rule of this file: plain data only (times are seconds on one monotonic clock, the
scenario's start being 0). The harness (`homing.bench.chaos.harness`) records what happened;
`summarize` says what it means:

- counts per `Outcome`, and the failures before the first byte that happened while another
  healthy worker existed: a worker is healthy at time t when no fault of the scenario is in
  force on it then (ground truth: the harness injected the faults), and a failure is dated
  by its request's start, when the gateway chose a worker;
- per fault, `stopped_after_s`: from the fault's start to the start of the last request
  that the faulty worker served (its `x-homing-worker`) and that started before the fault
  ended (0 when none did); `stopped` is False when it still served requests that started
  in the last quarter of a fault window of at least MIN_STOP_WINDOW_S (the router never
  stopped sending to it); `back_after_s`: from the fault's end to the start of the first
  request started after it that the worker served (None: none did before the load stopped);
  both None when the worker served nothing before the fault either (not applicable);
- TTFT (send to first content) and total time of the completed requests: p50, p99, max;
- the checks the suite claims (`CHECKS`); a scenario passes when all hold.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from homing.bench.chaos.outcome import Outcome
from homing.bench.report import percentile

MIN_STOP_WINDOW_S = 2.0
"""The shortest fault window for which "never stopped" is judged (a restart is shorter)."""

CHECKS = {
    "no_hung": "no request passed its client deadline",
    "no_failure_before_first_byte_with_healthy_other": (
        "no request failed before its first byte while another healthy worker existed"
    ),
    "errors_explicit": "every stream that failed after content ended with an error event",
    "recovered": "every faulty worker served new requests after its fault ended",
    "served": "some requests completed",
    "settled": "every worker was healthy in the gateway when the scenario began",
}
"""Check name -> what it claims."""

FAILURE_SAMPLES = 10
"""Failed requests of each outcome whose reason a summary keeps."""


@dataclass(frozen=True)
class RequestRecord:
    """One request of the load: when (s), what answered it, and its verdict."""

    client: int
    start_s: float
    end_s: float
    status: int | None
    worker: str | None
    """The `x-homing-worker` header of the response (None without one)."""
    first_content_s: float | None
    outcome: Outcome
    reason: str


@dataclass(frozen=True)
class FaultWindow:
    """One injected fault: `kind` on worker `worker` (its gateway id) from `start_s` to
    `end_s` (None: it never ended, e.g. a killed worker that did not come back)."""

    kind: str
    worker: str
    start_s: float
    end_s: float | None

    def active(self, t: float) -> bool:
        """True while the fault is in force at time `t`."""
        end = math.inf if self.end_s is None else self.end_s
        return self.start_s <= t < end


def healthy_workers(workers: Iterable[str], faults: Sequence[FaultWindow], t: float) -> list[str]:
    """The workers with no fault in force at time `t`."""
    faulty = {f.worker for f in faults if f.active(t)}
    return [w for w in workers if w not in faulty]


def stop_and_back(
    fault: FaultWindow, records: Sequence[RequestRecord]
) -> tuple[float | None, bool | None, float | None]:
    """(stopped_after_s, stopped, back_after_s) of `fault` (see the module docstring)."""
    served = sorted(r.start_s for r in records if r.worker == fault.worker and r.status == 200)
    if not any(s < fault.start_s for s in served):
        return None, None, None
    end = math.inf if fault.end_s is None else fault.end_s
    during = [s for s in served if fault.start_s <= s < end]
    stopped_after = (during[-1] - fault.start_s) if during else 0.0
    stopped: bool | None = True
    if fault.end_s is not None and fault.end_s - fault.start_s >= MIN_STOP_WINDOW_S:
        last_quarter = fault.end_s - (fault.end_s - fault.start_s) / 4
        stopped = not any(s >= last_quarter for s in during)
    after = [s for s in served if s >= end]
    back_after = (after[0] - end) if after else None
    return round(stopped_after, 3), stopped, None if back_after is None else round(back_after, 3)


def gateway_healthy_at(
    samples: Sequence[tuple[float, Mapping[str, bool]]], t: float
) -> list[str] | None:
    """The workers the gateway reported healthy in the last sample at or before `t`."""
    last = None
    for at, healthy in samples:
        if at > t:
            break
        last = healthy
    return None if last is None else sorted(w for w, ok in last.items() if ok)


def summarize(
    name: str,
    records: Sequence[RequestRecord],
    faults: Sequence[FaultWindow],
    workers: Sequence[str],
    *,
    health_samples: Sequence[tuple[float, Mapping[str, bool]]] = (),
    retried: int | None = None,
    retried_source: str | None = None,
    retry_outcomes: Mapping[str, int] | None = None,
    migrated: int | None = None,
    migration_outcomes: Mapping[str, int] | None = None,
    settled: bool = True,
    load_end_s: float | None = None,
) -> dict[str, Any]:
    """The scenario's figures and checks as a JSON-able dict.

    `workers`: every worker's gateway id; `health_samples`: (time, worker -> healthy) as the
    gateway reported them, in time order; `retried`: requests the gateway retried during the
    scenario (None: not known), where that figure came from and the retry counter's change
    by outcome; `migrated`: streams resumed on another worker after their first byte (None:
    no such counter) and that counter's change by outcome; `settled`: every worker was
    healthy when it began; `load_end_s`: when the clients stopped starting requests.
    """
    counts = Counter(r.outcome for r in records)
    early = [r for r in records if r.outcome is Outcome.FAILED_BEFORE_FIRST_BYTE]
    early_rows = []
    with_healthy = 0
    for r in early:
        others = healthy_workers(workers, faults, r.start_s)
        with_healthy += bool(others)
        early_rows.append(
            {
                "start_s": round(r.start_s, 3),
                "reason": r.reason,
                "healthy_workers": others,
                "gateway_healthy_workers": gateway_healthy_at(health_samples, r.start_s),
            }
        )
    per_fault = []
    for f in faults:
        stopped_after, stopped, back_after = stop_and_back(f, records)
        per_fault.append(
            {
                "kind": f.kind,
                "worker": f.worker,
                "start_s": round(f.start_s, 3),
                "end_s": None if f.end_s is None else round(f.end_s, 3),
                "stopped_after_s": stopped_after,
                "stopped": stopped,
                "back_after_s": back_after,
            }
        )
    served_by = Counter(r.worker or "-" for r in records if r.status == 200)
    done = [r for r in records if r.outcome is Outcome.COMPLETED]
    durations = [r.end_s - r.start_s for r in done]
    ttfts = [r.first_content_s - r.start_s for r in done if r.first_content_s is not None]
    checks = {
        "no_hung": counts[Outcome.HUNG] == 0,
        "no_failure_before_first_byte_with_healthy_other": with_healthy == 0,
        "errors_explicit": counts[Outcome.CUT] == 0,
        "recovered": all(
            f["end_s"] is not None and (f["back_after_s"] is not None or f["stopped"] is None)
            for f in per_fault
        ),
        "served": counts[Outcome.COMPLETED] > 0,
        "settled": settled,
    }
    samples: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.outcome is not Outcome.COMPLETED:
            rows = samples.setdefault(r.outcome.value, [])
            if len(rows) < FAILURE_SAMPLES:
                rows.append(
                    {"start_s": round(r.start_s, 3), "worker": r.worker, "reason": r.reason}
                )
    return {
        "name": name,
        "sent": len(records),
        "completed": counts[Outcome.COMPLETED],
        "failed_before_first_byte": counts[Outcome.FAILED_BEFORE_FIRST_BYTE],
        "failed_before_first_byte_with_healthy_other": with_healthy,
        "failed_mid_stream": counts[Outcome.FAILED_MID_STREAM],
        "cut": counts[Outcome.CUT],
        "hung": counts[Outcome.HUNG],
        "retried": retried,
        "retried_source": retried_source,
        "retry_outcomes": None if retry_outcomes is None else dict(retry_outcomes),
        "migrated": migrated,
        "migration_outcomes": None if migration_outcomes is None else dict(migration_outcomes),
        "faults": per_fault,
        "served_by_worker": dict(sorted(served_by.items())),
        "completed_latency_s": {
            "ttft": _quantiles(ttfts),
            "total": _quantiles(durations),
        },
        "load_end_s": None if load_end_s is None else round(load_end_s, 3),
        "failures_before_first_byte": early_rows[:FAILURE_SAMPLES],
        "failure_samples": samples,
        "checks": checks,
        "ok": all(checks.values()),
    }


def _quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max of `values` (s, rounded to ms; None when empty)."""

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 3)

    return {
        "p50": r(percentile(values, 50)),
        "p99": r(percentile(values, 99)),
        "max": r(max(values) if values else None),
    }


# ---------------------------------------------------------------------------- counters

RETRY_METRIC_NAMES = (
    "homing_retries_total",
    "homing_request_retries_total",
    "homing_requests_retried_total",
)
"""Counter names read first, in this order, as the gateway's count of retries."""

MIGRATION_METRIC_NAMES = ("homing_stream_migrations_total",)
"""Counter names of streams resumed on another worker after their first byte."""

RETRIED_OUTCOMES = {"homing_retries_total": "retried", "homing_stream_migrations_total": "migrated"}
"""For a counter with an `outcome` label, the outcome that counts as done (the others say
why it was not: budget exhausted, no other worker, ...)."""

_RETRY_NAME = re.compile(r"^homing_\w*(retries|retried|retry)\w*_total$")
_NOT_RETRIES = re.compile(r"budget|denied|exhaust|skipped|refused|rejected|limit")


@dataclass(frozen=True)
class CounterReading:
    """One counter read from `/metrics`: its sample name and its value summed by the
    `outcome` label (key "" when it has none)."""

    name: str
    by_outcome: dict[str, float]

    def done(self) -> float:
        """The count that did happen: the RETRIED_OUTCOMES outcome when the counter has an
        outcome label ("retried" for retries), else everything."""
        if set(self.by_outcome) == {""}:
            return self.by_outcome[""]
        return self.by_outcome.get(RETRIED_OUTCOMES.get(self.name, "retried"), 0.0)


def read_counter(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
    names: Sequence[str],
    pattern: re.Pattern[str] | None = None,
) -> CounterReading | None:
    """The first of `names` among `samples` ((sample name, labels, value), as Prometheus'
    text format gives them), else the first sample name matching `pattern` (and not naming
    refused or budget-limited retries); None when there is none."""
    by_name: dict[str, dict[str, float]] = {}
    for sample, labels, value in samples:
        outcomes = by_name.setdefault(sample, {})
        key = labels.get("outcome", "")
        outcomes[key] = outcomes.get(key, 0.0) + value
    for name in names:
        if name in by_name:
            return CounterReading(name, by_name[name])
    if pattern is not None:
        found = sorted(n for n in by_name if pattern.match(n) and not _NOT_RETRIES.search(n))
        if found:
            return CounterReading(found[0], by_name[found[0]])
    return None


def retry_counter(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> CounterReading | None:
    """The gateway's retry counter (RETRY_METRIC_NAMES first, else any
    `homing_*retr*_total`), or None."""
    return read_counter(samples, RETRY_METRIC_NAMES, _RETRY_NAME)


def migration_counter(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
) -> CounterReading | None:
    """The gateway's stream-migration counter, or None."""
    return read_counter(samples, MIGRATION_METRIC_NAMES)


def counter_delta(
    before: CounterReading | None, after: CounterReading | None
) -> tuple[int, dict[str, int]] | None:
    """(done, by outcome) between two readings of one counter; None unless both exist
    under the same name."""
    if before is None or after is None or before.name != after.name:
        return None
    outcomes = {
        k: round(v - before.by_outcome.get(k, 0.0)) for k, v in sorted(after.by_outcome.items())
    }
    return round(after.done() - before.done()), outcomes


def count_retried_log_lines(lines: Iterable[str]) -> int:
    """How many of the gateway's JSON log `lines` are a `request_retried` event."""
    count = 0
    for line in lines:
        if "request_retried" not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        count += isinstance(event, dict) and event.get("event") == "request_retried"
    return count
