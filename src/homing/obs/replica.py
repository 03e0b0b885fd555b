"""Per-replica signals: one typed snapshot per worker, from its engine's load record and the
gateway's own records of the requests it served.

Rule of this file: pure; the live worker state is read through `WorkerView` (obs is a leaf
package and imports nothing of the engines). `ReplicaStats` keeps each worker's recent
requests in a sliding window on an injected clock; `snapshot` joins them with the worker's
state. This snapshot is what the metrics export per worker, and what control loops
(overload checks, outlier detection, the autoscaler) read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from homing.obs.window import WindowedSums

#: Seconds of a worker's own request records its snapshot summarises.
RECENT_WINDOW_S = 60.0


class LoadView(Protocol):
    """The engine's latest load record (`homing.engines.pool.EngineLoadView`)."""

    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def token_usage(self) -> float: ...
    @property
    def updated_at(self) -> float: ...


class WorkerView(Protocol):
    """The parts of a pool worker's state read here (`homing.engines.pool.WorkerState`)."""

    @property
    def worker_id(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def load(self) -> LoadView | None: ...
    @property
    def routable(self) -> bool: ...
    @property
    def phase(self) -> str:
        """Its lifecycle phase (the pool's `Phase` is a `StrEnum`: its value)."""
        ...

    @property
    def breaker(self) -> str:
        """Its circuit breaker's state: "closed", "open" or "half_open"."""
        ...


@dataclass(frozen=True)
class ReplicaSnapshot:
    """One worker's signals at a moment.

    From the engine's load record (None before the first): `running` / `waiting`
    requests, `kv_usage` in [0, 1], `load_age_s` (seconds since the record). From the
    gateway: `in_flight` requests dispatched to it. Over its requests that ended in the last
    `RECENT_WINDOW_S` (None when none, or none with that figure): `requests`,
    `cache_hit_ratio` (cached / prompt tokens), `ttft_per_uncached_token_s` (seconds from
    routing to the first token per prompt token not served from cache: the worker's share
    of TTFT), `tpot_s` (seconds per output token after the
    first), `error_ratio` (requests the worker failed / requests), `uncached_tokens` (the
    prompt tokens not served from cache of the requests timed to their first token).
    `phase`: its lifecycle
    phase; `healthy`: its probes pass; `state` / `reason`: "ready", or why it takes no
    requests ("unhealthy" with its last error, "breaker_open" with its breaker's state, or
    its phase).
    """

    model: str
    worker_id: str
    version: str
    phase: str
    healthy: bool
    state: str
    reason: str | None
    in_flight: int
    running: int | None
    waiting: int | None
    kv_usage: float | None
    load_age_s: float | None
    requests: int
    cache_hit_ratio: float | None
    ttft_per_uncached_token_s: float | None
    tpot_s: float | None
    error_ratio: float | None
    uncached_tokens: int = 0


@dataclass(frozen=True)
class AttemptRecord:
    """One worker's part of a request (the attempt it served; a retried or migrated request
    has one per worker it tried), as `ReplicaStats.record` takes it.

    `failed`: the worker failed it; `prompt_tokens` / `cached_tokens`: the input the worker
    was given and how much of it its cache served; `ttft_s`: from the attempt's start on the
    worker (its lease) to its first token, seconds; `tpot_s`: seconds per output token of
    its own tokens after its first; `completion_tokens`: the tokens it produced.
    """

    worker_id: str
    failed: bool
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    completion_tokens: int


class ReplicaStats:
    """Each worker's recent request records (sliding window of `RECENT_WINDOW_S`, in
    buckets of `resolution_s`: 1 s, so a control loop's shorter window is exact to a
    second; 61 buckets of 8 floats per worker)."""

    _FIELDS = (
        "requests",
        "errors",
        "prompt_tokens",
        "cached_tokens",
        "ttft_s",
        "uncached_tokens",
        "decode_s",
        "decode_tokens",
    )

    def __init__(self, *, now: Callable[[], float], resolution_s: float = 1.0) -> None:
        self._now = now
        self._resolution_s = resolution_s
        self._workers: dict[str, WindowedSums] = {}

    def record(
        self,
        worker_id: str,
        *,
        failed: bool,
        prompt_tokens: int,
        cached_tokens: int,
        ttft_s: float | None,
        tpot_s: float | None,
        completion_tokens: int,
    ) -> None:
        """Count one request (or one attempt of it, `AttemptRecord`) that ended on
        `worker_id` (`failed`: the worker failed it; `ttft_s`: from routing to the worker to
        its first token, seconds)."""
        sums = self._workers.get(worker_id)
        if sums is None:
            sums = self._workers[worker_id] = WindowedSums(
                self._FIELDS,
                now=self._now,
                horizon_s=RECENT_WINDOW_S,
                resolution_s=self._resolution_s,
            )
        uncached = max(0, prompt_tokens - cached_tokens)
        timed = ttft_s is not None and uncached > 0
        decode_tokens = completion_tokens - 1 if tpot_s is not None else 0
        sums.add(
            (
                1,
                failed,
                prompt_tokens,
                cached_tokens,
                ttft_s if timed and ttft_s is not None else 0.0,
                uncached if timed else 0,
                tpot_s * decode_tokens if tpot_s is not None else 0.0,
                decode_tokens,
            )
        )

    def record_attempt(self, attempt: AttemptRecord) -> None:
        """`record` one worker's part of a request."""
        self.record(
            attempt.worker_id,
            failed=attempt.failed,
            prompt_tokens=attempt.prompt_tokens,
            cached_tokens=attempt.cached_tokens,
            ttft_s=attempt.ttft_s,
            tpot_s=attempt.tpot_s,
            completion_tokens=attempt.completion_tokens,
        )

    def forget(self, worker_id: str) -> None:
        """Drop a worker's records (it left the pool)."""
        self._workers.pop(worker_id, None)

    def snapshot(
        self, model: str, worker: WorkerView, window_s: float = RECENT_WINDOW_S
    ) -> ReplicaSnapshot:
        """`worker`'s snapshot now, its request figures over the last `window_s` seconds
        (at most `RECENT_WINDOW_S`; outlier detection asks for a shorter one)."""
        load = worker.load
        phase = str(worker.phase)  # a plain str: a `StrEnum`'s str() is its value
        breaker = worker.breaker
        if worker.routable:
            state, reason = "ready", None
        elif not worker.healthy:
            state = "unhealthy"
            reason = worker.last_error or "probes failing"
        elif phase == "ready" and breaker != "closed":
            state, reason = "breaker_open", f"circuit breaker {breaker}"
        else:
            state, reason = phase, f"phase {phase}"
        sums = self._workers.get(worker.worker_id)
        s = sums.sums(window_s) if sums is not None else None
        requests = int(s["requests"]) if s else 0
        return ReplicaSnapshot(
            model=model,
            worker_id=worker.worker_id,
            version=worker.version,
            phase=phase,
            healthy=worker.healthy,
            state=state,
            reason=reason,
            in_flight=worker.in_flight,
            running=load.running if load is not None else None,
            waiting=load.waiting if load is not None else None,
            kv_usage=load.token_usage if load is not None else None,
            load_age_s=max(0.0, self._now() - load.updated_at) if load is not None else None,
            requests=requests,
            cache_hit_ratio=_ratio(s, "cached_tokens", "prompt_tokens"),
            ttft_per_uncached_token_s=_ratio(s, "ttft_s", "uncached_tokens"),
            tpot_s=_ratio(s, "decode_s", "decode_tokens"),
            error_ratio=_ratio(s, "errors", "requests"),
            uncached_tokens=int(s["uncached_tokens"]) if s else 0,
        )


def _ratio(sums: dict[str, float] | None, num: str, den: str) -> float | None:
    if not sums or sums[den] <= 0:
        return None
    return sums[num] / sums[den]
