"""Per-replica capacity from measured windows: a measurement at the limit, lower bounds
below it, bounded moves and no NaN."""

from __future__ import annotations

import math

import pytest

from homing.scaler.capacity import CapacityEstimator, ReplicaSample

SLO = 0.05  # s per output token


def est(**kw: float) -> CapacityEstimator:
    kw.setdefault("smoothing", 1.0)
    return CapacityEstimator(
        tpot_slo_s=SLO, seed_decode_streams=96.0, seed_prefill_tokens_per_s=7000.0, **kw
    )


def rs(
    running: float,
    tpot: float | None,
    prefill: float = 0.0,
    ttft_per_token: float | None = None,
) -> ReplicaSample:
    return ReplicaSample(running, tpot, prefill, ttft_per_token)


def test_a_replica_at_its_limit_measures_capacity() -> None:
    """80 streams at 0.9 x the SLO: capacity 80 / 0.9 = 88.9 (smoothing 1: taken whole)."""
    e = est()
    e.observe([rs(80, 0.045)])
    assert e.decode_streams == pytest.approx(80 / 0.9)


def test_the_measurement_is_smoothed() -> None:
    e = est(smoothing=0.2)
    e.observe([rs(80, 0.05)])
    assert e.decode_streams == pytest.approx(96 + 0.2 * (80 - 96))


def test_a_replica_below_its_limit_only_raises_a_lower_bound() -> None:
    """150 streams at half the SLO prove >= 150 (not 300); 20 streams prove nothing new."""
    e = est()
    e.observe([rs(20, 0.01)])
    assert e.decode_streams == 96.0
    e.observe([rs(150, 0.025)])
    assert e.decode_streams == 150.0


def test_one_bad_window_cannot_collapse_the_estimate() -> None:
    """A replica reporting 1 stream at 100x the SLO halves the estimate at most."""
    e = est()
    e.observe([rs(1, 5.0)])
    assert e.decode_streams == 48.0
    e2 = est()
    e2.observe([rs(1000, 0.04)])
    assert e2.decode_streams == 192.0


def test_repeated_bad_windows_stop_at_the_floor() -> None:
    e = est()
    for _ in range(20):
        e.observe([rs(1, 5.0)])
    assert e.decode_streams == pytest.approx(9.6)


def test_never_nan_zero_or_negative() -> None:
    e = est()
    nan = float("nan")
    e.observe(
        [
            rs(nan, 0.05),
            rs(80, nan, nan, nan),
            rs(80, 0.0, -5.0, 0.0),
            rs(80, float("inf"), float("inf"), -1.0),
            rs(0.5, 0.05),
        ]
    )
    assert (e.decode_streams, e.prefill_tokens_per_s) == (96.0, 7000.0)
    e.observe([])
    assert math.isfinite(e.decode_streams) and e.decode_streams > 0


def test_prefill_takes_the_larger_lower_bound() -> None:
    """9,000 tok/s prefilled, or 1 / 0.0001 s per token = 10,000: the estimate rises to
    10,000; a slower window does not lower it."""
    e = est()
    e.observe([rs(0, None, 9000.0, 0.0001)])
    assert e.prefill_tokens_per_s == pytest.approx(10_000.0)
    e.observe([rs(0, None, 100.0, 0.01)])
    assert e.prefill_tokens_per_s == pytest.approx(10_000.0)


def test_prefill_rises_at_most_twofold_per_window() -> None:
    e = est()
    e.observe([rs(0, None, 50_000.0, None)])
    assert e.prefill_tokens_per_s == 14_000.0


def test_arguments_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError):
        CapacityEstimator(tpot_slo_s=0.0, seed_decode_streams=1, seed_prefill_tokens_per_s=1)
    with pytest.raises(ValueError):
        CapacityEstimator(
            tpot_slo_s=0.05, seed_decode_streams=1, seed_prefill_tokens_per_s=1, smoothing=0
        )
