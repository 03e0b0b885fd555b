"""Sums over a sliding time window, in fixed buckets, on an injected clock.

Rule of this file: pure bookkeeping, no I/O. A value added at time t lands in the bucket
`floor(t / resolution_s)`; a query over the last `window_s` seconds sums the current bucket
and the ones before it that start after `now - window_s` (so the window is exact to one
bucket, `resolution_s`), and a rate divides by the span those buckets cover.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence


class WindowedSums:
    """Per-field sums over the last `horizon_s` seconds, kept in buckets of `resolution_s`.

    `fields`: the names of the summed quantities. `now`: the clock (seconds, monotonic).
    Memory: at most `horizon_s / resolution_s + 1` buckets of `len(fields)` floats.
    Raises `ValueError` for a non-positive resolution or a horizon below it.
    """

    def __init__(
        self,
        fields: Sequence[str],
        *,
        now: Callable[[], float],
        horizon_s: float,
        resolution_s: float,
    ) -> None:
        if resolution_s <= 0 or horizon_s < resolution_s:
            raise ValueError("need 0 < resolution_s <= horizon_s")
        self.fields = tuple(fields)
        self._now = now
        self.horizon_s = horizon_s
        self.resolution_s = resolution_s
        self._max_buckets = math.ceil(horizon_s / resolution_s) + 1
        self._buckets: deque[tuple[int, list[float]]] = deque()
        self.started_at = now()

    def add(self, values: Sequence[float]) -> None:
        """Add one value per field (in `fields` order) at the clock's current time."""
        slot = math.floor(self._now() / self.resolution_s)
        buckets = self._buckets
        if buckets and buckets[-1][0] == slot:
            sums = buckets[-1][1]
            for i, v in enumerate(values):
                sums[i] += v
        else:
            buckets.append((slot, [float(v) for v in values]))
            self._expire(slot)

    def sums(self, window_s: float) -> dict[str, float]:
        """Each field's sum over the buckets that cover the last `window_s` seconds (capped
        at the horizon): the current, partial one and those before it."""
        return self.sums_many([window_s])[window_s]

    def sums_many(self, windows: list[float]) -> dict[float, dict[str, float]]:
        """`sums(w)` for each of `windows`, in one pass over the buckets."""
        now_slot = math.floor(self._now() / self.resolution_s)
        self._expire(now_slot)
        firsts = sorted(((self._first_slot(now_slot, w), w) for w in windows), reverse=True)
        out: dict[float, dict[str, float]] = {}
        total = [0.0] * len(self.fields)
        buckets = reversed(self._buckets)
        bucket = next(buckets, None)
        for first, window in firsts:  # newest window first: the totals only grow
            while bucket is not None and bucket[0] >= first:
                for i, v in enumerate(bucket[1]):
                    total[i] += v
                bucket = next(buckets, None)
            out[window] = dict(zip(self.fields, total, strict=True))
        return out

    def span_s(self, window_s: float) -> float:
        """The seconds `sums(window_s)` covers, to divide a rate by: from the first bucket
        it sums (or from when this was made, if later) to now; at least one bucket."""
        now = self._now()
        first = self._first_slot(math.floor(now / self.resolution_s), window_s)
        start = max(first * self.resolution_s, self.started_at)
        return max(self.resolution_s, now - start)

    def _first_slot(self, now_slot: int, window_s: float) -> int:
        return now_slot - math.ceil(min(window_s, self.horizon_s) / self.resolution_s) + 1

    def _expire(self, now_slot: int) -> None:
        oldest = now_slot - self._max_buckets + 1
        buckets = self._buckets
        while buckets and buckets[0][0] < oldest:
            buckets.popleft()
