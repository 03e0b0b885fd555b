"""Outlier ejection of a pool's workers (Envoy's outlier detection, extended to latency), as
pure policy on an injected clock.

Rule of this file: `OutlierDetector.evaluate` is called once per interval with one
snapshot per worker (`homing.obs.replica.ReplicaSnapshot` fits `WorkerSignals`) and returns
a `Plan`; `probed` takes the outcome of a readmission probe. No I/O: the runner
(`homing.engines.ejector`) applies the plan through the pool's lifecycle (`eject`,
`readmit`) and sends the probes.

The rule, per interval, for each ready (routable) worker with at least `min_requests`
requests in the snapshot's window:
- over on TPOT: its time per output token is above `factor` x the median TPOT of the
  other workers (any phase but ejected, each with at least `min_requests` requests);
- over on TTFT: the same for its seconds to first token per uncached prompt token, judged
  only among workers whose requests average at least `min_uncached_tokens` uncached
  prompt tokens (below that, TTFT is a scheduler step and queueing, not prefill, and a
  worker holding the hot prefixes would look slow per uncached token);
- over on errors: its error ratio is at least `error_ratio` and above `factor` x the
  others' median error ratio (a pool failing everywhere ejects nobody).
With no other worker to compare with, nobody is over. A worker over for `consecutive`
intervals in a row is ejected (an interval it is not over, or lacks the requests, breaks
the run), worst ratio first, unless that would eject more than `max_ejected_fraction` of
the pool (ready and ejected workers; at least one may be ejected once the pool has two) or
leave it without a ready worker: then the ejection is skipped (`Skip`, its run kept, so it
goes as soon as it is allowed). Ejection time: `base_ejection_s * 2**(n - 1)` for its n-th
ejection, capped at `max_ejection_s`; n goes down by one for each interval it is judged
(ready, enough requests, past its grace) and not over (Envoy decrements its ejection
multiplier for each interval a host is healthy).

Return: once its ejection time has passed, each interval the runner probes the worker and
one ready peer (`Probe`) with the same short greedy generation; the worker is readmitted
(`probed` returns True) when its probe succeeded and its TPOT is within `factor` x the
peer's (with no peer, or no peer result, its own success suffices); else it stays ejected
and is probed again next interval. A readmitted worker is not judged again until
`window_s` has passed, so records from before its ejection cannot eject it twice. When the
pool has no ready worker left, every ejected worker is readmitted at once (Envoy's panic
threshold: serving from an outlier beats serving from none): at the next evaluation, and,
through `rescue`, as soon as the runner sees the pool's last ready worker go (others failing
after an ejection), not an interval later.

Defaults and their sources: `interval_s` 5 s (half of Envoy's 10 s `interval`: an LLM
request lasts seconds, so a slow replica shows within one); `window_s` 15 s (three
intervals of requests); `factor` 3 (a replica at 3x its peers' TPOT is throttled or broken,
not noisy: decode TPOT varies ~20-50% with batch size); `consecutive` 2 (one noisy interval
never ejects); `min_requests` 5 (each request's TPOT already averages hundreds of token
intervals; Envoy's per-host 100 is for short RPCs); `min_uncached_tokens` 256 (an H100
prefills an 8B model's 256 tokens in ~20 ms, about one decode step: from there on prefill
dominates TTFT); `error_ratio` 0.5 (half the requests
failed); `base_ejection_s` 10 s doubling to `max_ejection_s` 300 s (Envoy's 30 s base is
for a 10 s interval; its `max_ejection_time` default is 300 s); `max_ejected_fraction`
0.5 (Envoy's `max_ejection_percent` default is 10%, too few for pools of 2-8 replicas,
where it could eject nobody; half keeps most capacity while a bad half is taken out).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class OutlierConfig:
    """The rule's constants (see the module docstring for each one's meaning and source).
    Seconds for `*_s`. ValueError for values out of range."""

    interval_s: float = 5.0
    window_s: float = 15.0
    factor: float = 3.0
    consecutive: int = 2
    min_requests: int = 5
    min_uncached_tokens: int = 256
    error_ratio: float = 0.5
    base_ejection_s: float = 10.0
    max_ejection_s: float = 300.0
    max_ejected_fraction: float = 0.5
    probe_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.window_s <= 0 or self.probe_timeout_s <= 0:
            raise ValueError("interval_s, window_s and probe_timeout_s must be positive")
        if self.factor <= 1:
            raise ValueError("factor must be above 1")
        if self.consecutive < 1 or self.min_requests < 1:
            raise ValueError("consecutive and min_requests must be at least 1")
        if self.min_uncached_tokens < 0:
            raise ValueError("min_uncached_tokens must not be negative")
        if not 0 < self.error_ratio <= 1:
            raise ValueError("error_ratio must be in (0, 1]")
        if not 0 < self.base_ejection_s <= self.max_ejection_s:
            raise ValueError("need 0 < base_ejection_s <= max_ejection_s")
        if not 0 < self.max_ejected_fraction <= 1:
            raise ValueError("max_ejected_fraction must be in (0, 1]")


class WorkerSignals(Protocol):
    """What the rule reads of one worker (`homing.obs.replica.ReplicaSnapshot` has it).

    `phase`: its lifecycle phase ("ready", "ejected", ...); `state`: "ready" when it takes
    requests now; `in_flight`: our requests on it; over its recent window: `requests`,
    `tpot_s`, `ttft_per_uncached_token_s` (seconds), `error_ratio` (None: no data) and
    `uncached_tokens` (prompt tokens its timed requests had to prefill).
    """

    @property
    def worker_id(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def requests(self) -> int: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def ttft_per_uncached_token_s(self) -> float | None: ...
    @property
    def error_ratio(self) -> float | None: ...
    @property
    def uncached_tokens(self) -> int: ...


@dataclass(frozen=True)
class Eject:
    """Eject `worker_id` for `duration_s` (its `times`-th ejection): its `reason` signal
    ("tpot", "ttft" or "errors") was `value` against the others' median `baseline`."""

    worker_id: str
    reason: str
    value: float
    baseline: float
    duration_s: float
    times: int


@dataclass(frozen=True)
class Skip:
    """`worker_id` is an outlier on `reason` but stays: `why` is "max_ejected" (the pool's
    share of ejected workers is reached) or "last_ready" (no other ready worker)."""

    worker_id: str
    reason: str
    why: str


@dataclass(frozen=True)
class Probe:
    """Probe ejected `worker_id` and ready `peer_id` (None: no ready peer) alike."""

    worker_id: str
    peer_id: str | None


@dataclass(frozen=True)
class Readmit:
    """Readmit `worker_id` now; `reason` "no_ready_worker" (the pool has none)."""

    worker_id: str
    reason: str


@dataclass(frozen=True)
class ProbeResult:
    """One probe generation: `ok` when it completed; `tpot_s` its seconds per output token
    after the first (None: fewer than two tokens); `error` what failed."""

    ok: bool
    tpot_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Plan:
    """What one interval decided, to apply in this order: readmissions, ejections, then
    probes (skips are for metrics and logs)."""

    readmissions: list[Readmit] = field(default_factory=list)
    ejections: list[Eject] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)


@dataclass
class _Track:
    strikes: int = 0
    times_ejected: int = 0
    ejected_until: float | None = None  # None: not ejected by us
    judged_from: float = 0.0  # not judged before this clock time (after a readmission)


def ejection_time(times: int, config: OutlierConfig) -> float:
    """Seconds of a worker's `times`-th ejection: `base * 2**(times - 1)`, capped."""
    return min(config.max_ejection_s, config.base_ejection_s * 2.0 ** max(0, times - 1))


def allowed_ejections(members: int, fraction: float) -> int:
    """Workers that may be ejected at once out of `members` (ready or ejected): the
    fraction, rounded down, but at least one when there are two or more."""
    if members < 2:
        return 0
    return max(1, int(members * fraction))


class OutlierDetector:
    """One pool's outlier state over time (see the module docstring). `now`: the clock."""

    def __init__(self, config: OutlierConfig, *, now: Callable[[], float]) -> None:
        self.config = config
        self._now = now
        self._tracks: dict[str, _Track] = {}

    def ejected(self) -> list[str]:
        """Ids of the workers this detector holds ejected."""
        return [w for w, t in self._tracks.items() if t.ejected_until is not None]

    def times_ejected(self, worker_id: str) -> int:
        """The worker's ejection count as the backoff sees it (0 when unknown)."""
        track = self._tracks.get(worker_id)
        return track.times_ejected if track is not None else 0

    def forget(self, worker_id: str) -> None:
        """Drop what is known of `worker_id` (it left the pool)."""
        self._tracks.pop(worker_id, None)

    def evaluate(self, workers: Sequence[WorkerSignals]) -> Plan:
        """One interval's decisions over `workers` (every worker of the pool, one snapshot
        each). Records the ejections and readmissions it plans: apply them at once."""
        cfg = self.config
        now = self._now()
        present = {w.worker_id for w in workers}
        for gone in [w for w in self._tracks if w not in present]:
            del self._tracks[gone]
        tracks = {w.worker_id: self._tracks.setdefault(w.worker_id, _Track()) for w in workers}
        for w in workers:  # someone else moved an ejected worker (drain, remove)
            if w.phase != "ejected":
                tracks[w.worker_id].ejected_until = None
        plan = Plan()
        ready = [w for w in workers if w.state == "ready"]
        ejected = [w for w in workers if w.phase == "ejected"]
        if not ready and ejected:
            return Plan(readmissions=self._rescue(ejected, tracks, now))
        baseline = [w for w in workers if w.phase != "ejected" and w.requests >= cfg.min_requests]
        over: list[tuple[float, WorkerSignals, str, float, float]] = []
        for w in ready:
            track = tracks[w.worker_id]
            if now < track.judged_from or w.requests < cfg.min_requests:
                track.strikes = 0  # not judged this interval: the run breaks
                continue
            found = self._outlier(w, [b for b in baseline if b.worker_id != w.worker_id])
            if found is None:
                track.strikes = 0
                track.times_ejected = max(0, track.times_ejected - 1)
                continue
            track.strikes += 1
            reason, value, median = found
            if track.strikes >= cfg.consecutive:
                ratio = value / median if median > 0 else float("inf")
                over.append((ratio, w, reason, value, median))
        members = sum(1 for w in workers if w.phase in ("ready", "ejected"))
        cap = allowed_ejections(members, cfg.max_ejected_fraction)
        n_ejected = len(ejected)
        n_ready = len(ready)
        out: set[str] = set()
        for _, w, reason, value, median in sorted(over, key=lambda o: o[0], reverse=True):
            if n_ready - 1 < 1:
                plan.skips.append(Skip(w.worker_id, reason, "last_ready"))
                continue
            if n_ejected + 1 > cap:
                plan.skips.append(Skip(w.worker_id, reason, "max_ejected"))
                continue
            track = tracks[w.worker_id]
            track.times_ejected += 1
            track.strikes = 0
            duration = ejection_time(track.times_ejected, cfg)
            track.ejected_until = now + duration
            n_ejected += 1
            n_ready -= 1
            out.add(w.worker_id)
            plan.ejections.append(
                Eject(w.worker_id, reason, value, median, duration, track.times_ejected)
            )
        peers = sorted(
            (w for w in ready if w.worker_id not in out), key=lambda w: (w.in_flight, w.worker_id)
        )
        for w in ejected:
            until = tracks[w.worker_id].ejected_until
            if until is not None and now >= until:
                peer = peers[0].worker_id if peers else None
                plan.probes.append(Probe(w.worker_id, peer))
        return plan

    def rescue(self, workers: Sequence[WorkerSignals]) -> list[Readmit]:
        """Between evaluations: when none of `workers` (every worker of the pool, one
        snapshot each) is ready, readmit every ejected one now (reason "no_ready_worker"),
        recorded as such: apply them at once. [] while a worker is ready. Strikes and
        backoff of the others are left as they are."""
        if any(w.state == "ready" for w in workers):
            return []
        ejected = [w for w in workers if w.phase == "ejected"]
        tracks = {w.worker_id: self._tracks.setdefault(w.worker_id, _Track()) for w in ejected}
        return self._rescue(ejected, tracks, self._now())

    def _rescue(
        self, ejected: Sequence[WorkerSignals], tracks: dict[str, _Track], now: float
    ) -> list[Readmit]:
        for w in ejected:
            self._readmitted(tracks[w.worker_id], now)
        return [Readmit(w.worker_id, "no_ready_worker") for w in ejected]

    def probed(self, worker_id: str, worker: ProbeResult, peer: ProbeResult | None) -> bool:
        """Record a readmission probe of `worker_id` (and its peer's, None: no peer); True
        when it is to be readmitted now (the module docstring's rule), recorded as such."""
        track = self._tracks.get(worker_id)
        if track is None or track.ejected_until is None or not worker.ok:
            return False
        if peer is not None and peer.ok and peer.tpot_s is not None and worker.tpot_s is not None:
            if worker.tpot_s > self.config.factor * peer.tpot_s:
                return False
        self._readmitted(track, self._now())
        return True

    def _readmitted(self, track: _Track, now: float) -> None:
        track.ejected_until = None
        track.strikes = 0
        track.judged_from = now + self.config.window_s

    def _outlier(
        self, w: WorkerSignals, others: Sequence[WorkerSignals]
    ) -> tuple[str, float, float] | None:
        """(reason, value, others' median) of the signal `w` is most over on, or None."""
        cfg = self.config
        found: list[tuple[float, str, float, float]] = []

        def prefills(s: WorkerSignals) -> bool:
            return s.uncached_tokens >= cfg.min_uncached_tokens * max(1, s.requests)

        for reason, get, judged in (
            ("tpot", lambda s: s.tpot_s, lambda s: True),
            ("ttft", lambda s: s.ttft_per_uncached_token_s, prefills),
        ):
            value = get(w) if judged(w) else None
            values = [v for v in (get(o) for o in others if judged(o)) if v is not None]
            if value is None or not values:
                continue
            median = statistics.median(values)
            if median > 0 and value > cfg.factor * median:
                found.append((value / median, reason, value, median))
        errors = w.error_ratio
        error_values = [o.error_ratio for o in others if o.error_ratio is not None]
        if errors is not None and error_values and errors >= cfg.error_ratio:
            median = statistics.median(error_values)
            if errors > cfg.factor * median:
                ratio = errors / median if median > 0 else float("inf")
                found.append((ratio, "errors", errors, median))
        if not found:
            return None
        _, reason, value, median = max(found, key=lambda f: f[0])
        return reason, value, median
