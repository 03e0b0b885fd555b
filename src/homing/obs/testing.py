"""Test helpers for packages that read homing's signals: snapshot builders and a recording
sink for request reports. Nothing here is used by the running gateway.

- `replica_snapshot(**fields)`: a `ReplicaSnapshot` with healthy, idle defaults.
- `FakeWorker`: a plain worker state (`homing.obs.replica.WorkerView`) for `ReplicaStats`.
- `RecordingRecorder`: a `RequestRecorder` that also keeps every report and its verdict,
  to pass as an `InferenceService`'s `recorder`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from homing.obs.replica import ReplicaSnapshot
from homing.obs.requests import RequestDone, RequestMetrics, RequestRecorder
from homing.obs.slo import Slo, Verdict

_DEFAULT_SNAPSHOT = ReplicaSnapshot(
    model="m",
    worker_id="w0",
    version="",
    phase="ready",
    healthy=True,
    state="ready",
    reason=None,
    in_flight=0,
    running=0,
    waiting=0,
    kv_usage=0.0,
    load_age_s=0.0,
    requests=0,
    cache_hit_ratio=None,
    ttft_per_uncached_token_s=None,
    tpot_s=None,
    error_ratio=None,
)


def replica_snapshot(**fields: Any) -> ReplicaSnapshot:
    """A ready, healthy, idle worker "w0" of model "m", with `fields` replaced."""
    return replace(_DEFAULT_SNAPSHOT, **fields)


@dataclass
class FakeLoad:
    """An engine load record (`homing.obs.replica.LoadView`)."""

    running: int = 0
    waiting: int = 0
    token_usage: float = 0.0
    updated_at: float = 0.0


@dataclass
class FakeWorker:
    """A worker's state as `ReplicaStats.snapshot` reads it."""

    worker_id: str = "w0"
    version: str = ""
    healthy: bool = True
    in_flight: int = 0
    last_error: str | None = None
    load: FakeLoad | None = field(default_factory=FakeLoad)
    phase: str = "ready"
    breaker: str = "closed"

    @property
    def routable(self) -> bool:
        """Ready, healthy and its breaker not open."""
        return self.healthy and self.phase == "ready" and self.breaker != "open"


class RecordingRecorder(RequestRecorder):
    """A `RequestRecorder` that keeps `reports`: each `(RequestDone, verdict)` in order.

    `metrics`: optional, as for `RequestRecorder`; `now`: default `time.monotonic`.
    """

    def __init__(
        self,
        *,
        now: Callable[[], float] = time.monotonic,
        metrics: RequestMetrics | None = None,
        default_slo: Slo | None = None,
    ) -> None:
        super().__init__(now=now, metrics=metrics, default_slo=default_slo)
        self.reports: list[tuple[RequestDone, Verdict | None]] = []

    def done(self, r: RequestDone) -> Verdict | None:
        """Report as `RequestRecorder` does, and keep the report."""
        verdict = super().done(r)
        self.reports.append((r, verdict))
        return verdict

    def outcomes(self) -> list[str]:
        """Each report's outcome, in order."""
        return [r.outcome for r, _ in self.reports]
