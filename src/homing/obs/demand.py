"""One model's demand as the gateway sees it: arrivals, the prefill work it routes, and how
fast first tokens come, over a sliding window on an injected clock.

Rule of this file: pure bookkeeping, no I/O. The gateway reports each request's arrival
(`arrived`), each routing decision's uncached prompt tokens (`routed`: the router's own
estimate of what the chosen worker must prefill, so prefix hits lost to a restart or a
scale event show up here as load) and each first token (`first_token`); `snapshot` gives
rates over the last `window_s`. TTFT's p95 comes from counts in fixed log-spaced buckets
(bounded memory; exact to one bucket, a factor `TTFT_BUCKET_RATIO`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from homing.obs.window import WindowedSums

#: Seconds of history a snapshot summarises (six 5-second scaler ticks).
DEMAND_WINDOW_S = 30.0
#: Bucket of the window (seconds).
DEMAND_RESOLUTION_S = 1.0
#: TTFT buckets: upper bounds `TTFT_FIRST_S * TTFT_BUCKET_RATIO**i`, 10 ms to ~160 s.
TTFT_FIRST_S = 0.01
TTFT_BUCKET_RATIO = 1.25
TTFT_BUCKETS = 44


@dataclass(frozen=True)
class Demand:
    """Demand over the last `window_s` seconds (rates per second; 0 with nothing seen).

    `arrivals_per_s`: requests that arrived. `prefill_tokens_per_s`: uncached prompt tokens
    routed. `ttft_p95_s`: the p95 of first-token times (upper bound of its bucket; None with
    no first token in the window). `last_arrival_at`: clock time of the newest arrival
    (None: none since start).
    """

    arrivals_per_s: float
    prefill_tokens_per_s: float
    ttft_p95_s: float | None
    last_arrival_at: float | None
    window_s: float


def _ttft_bucket(ttft_s: float) -> int:
    if not ttft_s > TTFT_FIRST_S:
        return 0
    i = math.ceil(math.log(ttft_s / TTFT_FIRST_S) / math.log(TTFT_BUCKET_RATIO) - 1e-9)
    return min(i, TTFT_BUCKETS - 1)


def _ttft_bound(i: int) -> float:
    return TTFT_FIRST_S * TTFT_BUCKET_RATIO**i


class DemandMeter:
    """Arrivals, routed prefill tokens and first-token times of one model (module docstring).

    `now`: the clock (seconds, monotonic). `window_s`: the span of `snapshot`.
    """

    def __init__(
        self,
        *,
        now: Callable[[], float],
        window_s: float = DEMAND_WINDOW_S,
        resolution_s: float = DEMAND_RESOLUTION_S,
    ) -> None:
        self._now = now
        self.window_s = window_s
        # Two windows, so a request's arrival and routing touch 2 sums, not every bucket's.
        self._load = WindowedSums(
            ("arrivals", "prefill_tokens"), now=now, horizon_s=window_s, resolution_s=resolution_s
        )
        self._ttft = WindowedSums(
            [f"ttft{i}" for i in range(TTFT_BUCKETS)],
            now=now,
            horizon_s=window_s,
            resolution_s=resolution_s,
        )
        self._one_ttft = [0.0] * TTFT_BUCKETS
        self.last_arrival_at: float | None = None

    def arrived(self) -> None:
        """A request arrived (before any quota or admission wait)."""
        self.last_arrival_at = self._now()
        self._load.add((1.0, 0.0))

    def routed(self, uncached_tokens: int) -> None:
        """A routing decision sends `uncached_tokens` prompt tokens to be prefilled."""
        if uncached_tokens > 0:
            self._load.add((0.0, float(uncached_tokens)))

    def first_token(self, ttft_s: float) -> None:
        """A request's first token came `ttft_s` seconds after its arrival."""
        if ttft_s >= 0 and math.isfinite(ttft_s):
            values = self._one_ttft.copy()
            values[_ttft_bucket(ttft_s)] = 1.0
            self._ttft.add(values)

    def snapshot(self) -> Demand:
        """Rates over the last `window_s` (the span covered so far, at least one bucket)."""
        sums = self._load.sums(self.window_s)
        span = self._load.span_s(self.window_s)  # at least one bucket
        ttft = self._ttft.sums(self.window_s)
        counts = [ttft[f"ttft{i}"] for i in range(TTFT_BUCKETS)]
        total = sum(counts)
        p95: float | None = None
        if total > 0:
            rank = 0.95 * total
            seen = 0.0
            for i, c in enumerate(counts):
                seen += c
                if seen >= rank - 1e-9:
                    p95 = _ttft_bound(i)
                    break
        return Demand(
            arrivals_per_s=sums["arrivals"] / span,
            prefill_tokens_per_s=sums["prefill_tokens"] / span,
            ttft_p95_s=p95,
            last_arrival_at=self.last_arrival_at,
            window_s=self.window_s,
        )
