"""Per-replica goodput of one pool, measured from its ready replicas: pure, no I/O, no clock.

Rule of this file: the estimate starts at the seed (the planning figure, as in
`homing.plan.chain`) and each `observe` moves it with what one window of samples proves.

Decode (`decode_streams`: concurrent decode streams one replica holds while its TPOT meets
the SLO). A sample with no TPOT, a non-finite one, or `running < 1` says nothing. A replica
whose TPOT is at or above `near` (0.8) x the SLO is at its limit, so `running * tpot_slo /
tpot` measures its capacity (exact at the SLO; with a step time that is a fixed part plus a
part per stream it errs low below the SLO and high above it, by the fixed part's share); the
mean of this window's measurements pulls the estimate by `smoothing` (EWMA) toward it. A
replica below `near` x the SLO is not at its limit: it only proves a lower bound, so the
estimate becomes at least its `running`.

Prefill (`prefill_tokens_per_s`: uncached prompt tokens per second one replica prefills
when it does nothing else). Whether a replica was prefill-bound (rather than queued behind
decode, the KV pool or an empty queue) cannot be told from these samples, so prefill gets
lower bounds only: a replica that prefilled `prefill_tokens_per_s` while also decoding can
prefill at least that fast, and since each request's TTFT is at least the time its own
uncached tokens took, `1 / ttft_per_uncached_token_s` (seconds of TTFT over uncached
tokens, summed over the window) is one too. The estimate becomes at least the largest of
them. A seed above the truth is therefore not corrected here; the policy's fast path
(TTFT over its SLO, error-budget burn) covers the shortfall it causes.

Guards: non-finite or non-positive inputs are ignored; one `observe` never moves an estimate
by more than a factor 2 either way (one bad window cannot collapse it); an estimate never
goes below `floor_fraction` (0.1) x its seed, so it is never 0, negative or NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NEAR_SLO = 0.8
"""A replica whose TPOT is at or above this share of the SLO is at its decode limit (below
it, a batch could still grow by a quarter before reaching the SLO)."""
FLOOR_FRACTION = 0.1
"""An estimate never goes below this share of its seed."""
MAX_STEP = 2.0
"""One `observe` moves an estimate by at most this factor, up or down."""


@dataclass(frozen=True)
class ReplicaSample:
    """One ready replica over the recent window.

    running: decode streams it ran (mean of its load records, or its in-flight count).
    tpot_s: its mean TPOT over the window, seconds (None: no finished requests).
    prefill_tokens_per_s: uncached prompt tokens it prefilled per second in the window.
    ttft_per_uncached_token_s: seconds of TTFT per uncached prompt token, summed over the
        window's requests (None: unknown).
    """

    running: float
    tpot_s: float | None
    prefill_tokens_per_s: float
    ttft_per_uncached_token_s: float | None


def _finite_positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


class CapacityEstimator:
    """Per-replica goodput of one pool, measured: `decode_streams` = concurrent decode
    streams one replica holds while meeting the TPOT SLO; `prefill_tokens_per_s` = uncached
    prompt tokens/s one replica prefills. The rule is the module docstring's.

    `tpot_slo_s`: the TPOT SLO (seconds, > 0). `seed_*`: the starting estimates (> 0).
    `smoothing`: EWMA weight of a window's measurement, in (0, 1]. `near`: share of the SLO
    at which a replica counts as at its limit, in (0, 1]. ValueError for values out of range.
    """

    def __init__(
        self,
        *,
        tpot_slo_s: float,
        seed_decode_streams: float,
        seed_prefill_tokens_per_s: float,
        smoothing: float = 0.2,
        near: float = NEAR_SLO,
    ) -> None:
        if not _finite_positive(tpot_slo_s):
            raise ValueError("tpot_slo_s must be a positive number")
        if not (
            _finite_positive(seed_decode_streams) and _finite_positive(seed_prefill_tokens_per_s)
        ):
            raise ValueError("seed_decode_streams and seed_prefill_tokens_per_s must be positive")
        if not 0 < smoothing <= 1:
            raise ValueError("smoothing must be in (0, 1]")
        if not 0 < near <= 1:
            raise ValueError("near must be in (0, 1]")
        self.tpot_slo_s = tpot_slo_s
        self.smoothing = smoothing
        self.near = near
        self._decode_floor = seed_decode_streams * FLOOR_FRACTION
        self._prefill_floor = seed_prefill_tokens_per_s * FLOOR_FRACTION
        self._decode = float(seed_decode_streams)
        self._prefill = float(seed_prefill_tokens_per_s)

    @property
    def decode_streams(self) -> float:
        """Concurrent decode streams one replica holds at the TPOT SLO (> 0)."""
        return self._decode

    @property
    def prefill_tokens_per_s(self) -> float:
        """Uncached prompt tokens per second one replica prefills (> 0)."""
        return self._prefill

    def observe(self, samples: Sequence[ReplicaSample]) -> None:
        """Fold one window's samples (one per ready replica) into both estimates, by the
        module docstring's rule. No samples, or none that say anything: no change."""
        measured: list[float] = []
        decode_bound = 0.0
        prefill_bound = 0.0
        for s in samples:
            if math.isfinite(s.running) and s.running >= 1 and _finite_positive(s.tpot_s):
                assert s.tpot_s is not None
                if s.tpot_s >= self.near * self.tpot_slo_s:
                    measured.append(s.running * self.tpot_slo_s / s.tpot_s)
                else:
                    decode_bound = max(decode_bound, s.running)
            if _finite_positive(s.prefill_tokens_per_s):
                prefill_bound = max(prefill_bound, s.prefill_tokens_per_s)
            if _finite_positive(s.ttft_per_uncached_token_s):
                assert s.ttft_per_uncached_token_s is not None
                prefill_bound = max(prefill_bound, 1.0 / s.ttft_per_uncached_token_s)
        decode = self._decode
        if measured:
            decode += self.smoothing * (sum(measured) / len(measured) - decode)
        decode = max(decode, decode_bound)
        self._decode = self._bounded(decode, self._decode, self._decode_floor)
        self._prefill = self._bounded(
            max(self._prefill, prefill_bound), self._prefill, self._prefill_floor
        )

    @staticmethod
    def _bounded(value: float, previous: float, floor: float) -> float:
        """`value` within a factor MAX_STEP of `previous`, and at least `floor`."""
        if not math.isfinite(value):
            return previous
        return max(floor, min(previous * MAX_STEP, max(previous / MAX_STEP, value)))
