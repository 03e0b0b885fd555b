"""The canary comparison: the window, the stats figures and the verdict rule."""

from __future__ import annotations

import math
import random

import pytest

from homing.rollout.compare import (
    MIN_UNCACHED_TOKENS,
    Check,
    Sample,
    Verdict,
    VerdictRule,
    VersionStats,
    VersionWindow,
    compare,
)


def _sample(
    at: float = 0.0,
    verdict: str | None = "met",
    ttft_s: float | None = 0.3,
    uncached_tokens: int = 1000,
    tpot_s: float | None = 0.02,
    completion_tokens: int = 100,
    finish_reason: str = "stop",
) -> Sample:
    return Sample(at, verdict, ttft_s, uncached_tokens, tpot_s, completion_tokens, finish_reason)


def _arm(
    version: str,
    n: int,
    *,
    met: int | None = None,
    failed: int = 0,
    per_token_s: float = 0.0003,
    uncached_tokens: int = 1000,
    tpot_s: float = 0.02,
    latency_samples: int | None = None,
) -> VersionStats:
    """Stats of `n` judged requests: `met` met (default all but `failed`), `failed` failed,
    the rest missed; the first `latency_samples` (default all) carry TTFT and TPOT."""
    met = n - failed if met is None else met
    timed = n if latency_samples is None else latency_samples
    window = VersionWindow()
    for i in range(n):
        verdict = "met" if i < met else "failed" if i < met + failed else "missed"
        window.add(
            version,
            _sample(
                at=1.0,
                verdict=verdict,
                ttft_s=per_token_s * uncached_tokens if i < timed else None,
                uncached_tokens=uncached_tokens,
                tpot_s=tpot_s if i < timed else None,
            ),
        )
    return window.stats(version, now=2.0)


def _check(verdict: Verdict, name: str) -> Check:
    return next(c for c in verdict.checks if c.name == name)


def test_window_drops_samples_older_than_window_and_respects_since() -> None:
    window = VersionWindow(window_s=10.0)
    for at in (0.0, 5.0, 9.0, 12.0):
        window.add("v1", _sample(at=at))
    assert window.stats("v1", now=12.0).requests == 3  # 0.0 is at the cutoff: out
    assert window.stats("v1", now=12.0, since=9.0).requests == 2
    assert window.stats("v1", now=20.0).requests == 1
    # Dropped for good: an earlier `now` does not bring them back.
    assert window.stats("v1", now=12.0).requests == 1
    assert window.versions() == ["v1"]
    assert window.stats("unknown", now=12.0).requests == 0


def test_window_max_samples_drops_the_oldest() -> None:
    window = VersionWindow(window_s=100.0, max_samples=3)
    for i in range(5):
        window.add("v1", _sample(at=float(i), completion_tokens=i))
    stats = window.stats("v1", now=5.0)
    assert stats.requests == 3
    assert stats.output_tokens_mean == pytest.approx(3.0)  # tokens 2, 3, 4 kept


def test_window_forget_and_clear_drop_versions() -> None:
    window = VersionWindow()
    window.add("a", _sample())
    window.add("b", _sample())
    window.forget("a")
    assert window.versions() == ["b"]
    window.clear()
    assert window.versions() == []


def test_window_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="window_s must be positive"):
        VersionWindow(window_s=0.0)
    with pytest.raises(ValueError, match="max_samples must be at least 1"):
        VersionWindow(max_samples=0)


def test_stats_figures_on_a_hand_computed_sample_set() -> None:
    window = VersionWindow()
    small = MIN_UNCACHED_TOKENS - 1
    samples = [
        Sample(1.0, "met", 0.2, 400, 0.01, 10, "stop"),
        Sample(1.0, "met", 0.6, 600, 0.03, 20, "stop"),
        # Too few uncached tokens for the TTFT figure: its slow TTFT must not count.
        Sample(1.0, "missed", 5.0, small, 0.05, 70, "length"),
        Sample(1.0, "failed", None, 800, None, 0, ""),  # no first token
        Sample(1.0, None, 0.1, 0, None, 0, "length"),  # outside the SLO
    ]
    for s in samples:
        window.add("v1", s)
    stats = window.stats("v1", now=1.0)
    assert (stats.requests, stats.judged, stats.failed, stats.met) == (5, 4, 1, 2)
    assert stats.error_rate == pytest.approx(0.25)
    assert stats.attainment == pytest.approx(0.5)
    # Ratio of sums: (0.2 + 0.6) / (400 + 600), not the mean of per-request ratios (0.00075).
    assert stats.ttft_per_uncached_token_s == pytest.approx(0.0008)
    assert stats.ttft_samples == 2
    assert stats.tpot_p50_s == pytest.approx(0.03)  # median of 0.01, 0.03, 0.05
    assert stats.tpot_samples == 3
    assert stats.output_tokens_mean == pytest.approx((10 + 20 + 70 + 0 + 0) / 5)
    assert stats.output_tokens_p50 == pytest.approx(10.0)
    assert stats.finish_reasons == pytest.approx({"stop": 0.4, "length": 0.4, "": 0.2})
    assert sum(stats.finish_reasons.values()) == pytest.approx(1.0)


def test_stats_of_no_samples_are_none() -> None:
    stats = VersionWindow().stats("v1", now=0.0)
    assert stats.requests == stats.judged == stats.ttft_samples == stats.tpot_samples == 0
    assert stats.error_rate is None and stats.attainment is None
    assert stats.ttft_per_uncached_token_s is None and stats.tpot_p50_s is None
    assert stats.output_tokens_mean is None and stats.output_tokens_p50 is None
    assert stats.finish_reasons == {}


def test_two_equal_arms_with_enough_samples_pass() -> None:
    verdict = compare(_arm("base", 1000, met=950), _arm("canary", 1000, met=950))
    assert verdict.result == "pass"
    assert verdict.reason == "all checks pass"
    assert [c.result for c in verdict.checks] == ["pass"] * 4


def test_equal_arms_at_99_percent_attainment_with_200_each_pass_attainment() -> None:
    verdict = compare(_arm("base", 200, met=198), _arm("canary", 200, met=198))
    assert _check(verdict, "attainment").result == "pass"


def test_error_rate_at_a_1_point_margin_needs_231_requests_even_with_no_errors() -> None:
    rule = VerdictRule(min_requests=200)
    at_200 = compare(_arm("base", 200, met=198), _arm("canary", 200, met=198), rule)
    assert at_200.result == "wait"
    assert _check(at_200, "error_rate").result == "wait"
    assert "(95% bound +1.1 points)" in _check(at_200, "error_rate").detail
    at_230 = compare(_arm("base", 230, met=228), _arm("canary", 230, met=228), rule)
    assert _check(at_230, "error_rate").result == "wait"
    at_231 = compare(_arm("base", 231, met=229), _arm("canary", 231, met=229), rule)
    assert at_231.result == "pass", at_231.reason


def test_equal_arms_at_95_percent_with_200_each_wait_for_a_narrower_interval() -> None:
    verdict = compare(_arm("base", 200, met=190), _arm("canary", 200, met=190))
    assert verdict.result == "wait"
    assert _check(verdict, "attainment").result == "wait"
    assert "interval too wide" in verdict.reason


def test_a_canary_twice_as_slow_fails_with_check_names_and_details() -> None:
    base = _arm("base", 300, per_token_s=0.0003, tpot_s=0.02)
    slow = _arm("canary", 300, per_token_s=0.0006, tpot_s=0.04)
    verdict = compare(base, slow)
    assert verdict.result == "fail"
    ttft = _check(verdict, "ttft_per_uncached_token")
    tpot = _check(verdict, "tpot")
    assert ttft.result == tpot.result == "fail"
    assert ttft.canary == pytest.approx(2 * ttft.baseline)
    assert "2.00x, over the 1.25x limit" in ttft.detail
    assert "TPOT p50" in tpot.detail
    assert verdict.reason == f"{ttft.detail}; {tpot.detail}"


def test_a_slow_canary_fails_under_min_requests_once_it_has_latency_samples() -> None:
    base = _arm("base", 300)
    slow = _arm("canary", 40, per_token_s=0.0006, tpot_s=0.04)
    verdict = compare(base, slow)
    assert slow.judged < VerdictRule().min_requests
    assert verdict.result == "fail"
    assert _check(verdict, "tpot").result == "fail"


def test_latency_checks_wait_for_samples_then_pass_uncompared_at_min_requests() -> None:
    base = _arm("base", 240)
    slow = _arm("canary", 240, per_token_s=0.0006, tpot_s=0.04, latency_samples=29)
    verdict = compare(base, slow)
    assert verdict.result == "wait"
    assert _check(verdict, "tpot").detail == "canary has 29 of 30 TPOT p50 samples"
    base, slow = _arm("base", 300), _arm("canary", 300, tpot_s=0.04, latency_samples=29)
    later = compare(base, slow)
    assert later.result == "pass", later.reason
    assert _check(later, "tpot").detail == "not compared: canary has 29 of 30 TPOT p50 samples"


def test_a_canary_with_10_points_lower_attainment_fails() -> None:
    verdict = compare(_arm("base", 500, met=475), _arm("canary", 500, met=425))
    assert verdict.result == "fail"
    check = _check(verdict, "attainment")
    assert check.result == "fail"
    assert check.detail.startswith("attainment canary 0.850 vs baseline 0.950: worse by more")
    assert "2.0 points (99.5% bound -" in check.detail


def test_a_canary_1_point_lower_on_small_samples_waits() -> None:
    verdict = compare(_arm("base", 100, met=95), _arm("canary", 100, met=94))
    assert verdict.result == "wait"
    assert _check(verdict, "attainment").result == "wait"


def test_a_canary_with_half_its_requests_failed_fails_at_30_samples() -> None:
    verdict = compare(_arm("base", 1000), _arm("canary", 30, failed=15))
    assert verdict.result == "fail"
    check = _check(verdict, "error_rate")
    assert check.result == "fail"
    assert check.canary == pytest.approx(0.5) and check.baseline == pytest.approx(0.0)
    assert "error rate canary 0.500 vs baseline 0.000: worse by more than 1.0 point" in (
        verdict.reason
    )


def test_a_cold_cache_canary_passes_ttft_per_uncached_token() -> None:
    window = VersionWindow()
    per_token_s = 0.0003
    # The baseline's warm cache serves most of each prompt; the canary's serves little. Both
    # prefill at the same speed per uncached token.
    warm = [_sample(at=1.0, ttft_s=per_token_s * 300, uncached_tokens=300) for _ in range(300)]
    cold = [_sample(at=1.0, ttft_s=per_token_s * 1000, uncached_tokens=1000) for _ in range(300)]
    for w, c in zip(warm, cold, strict=True):
        window.add("base", w)
        window.add("canary", c)
    base, canary = window.stats("base", now=2.0), window.stats("canary", now=2.0)

    def mean_ttft(samples: list[Sample]) -> float:
        return sum(s.ttft_s or 0.0 for s in samples) / len(samples)

    assert mean_ttft(cold) / mean_ttft(warm) > 2  # a naive TTFT comparison would fail it
    verdict = compare(base, canary)
    assert _check(verdict, "ttft_per_uncached_token").result == "pass"
    assert verdict.result == "pass"


def test_a_zero_baseline_latency_passes_a_zero_canary_and_fails_any_other() -> None:
    zero = _arm("base", 300, tpot_s=0.0)
    assert _check(compare(zero, _arm("canary", 300, tpot_s=0.0)), "tpot").result == "pass"
    check = _check(compare(zero, _arm("canary", 300, tpot_s=0.01)), "tpot")
    assert check.result == "fail" and "infx" in check.detail


def test_wait_reason_names_the_short_version_and_counts() -> None:
    verdict = compare(_arm("base", 500), _arm("canary", 41))
    assert verdict.result == "wait"
    assert verdict.reason.startswith("canary has 41 of 250 judged requests")
    both = compare(_arm("base", 10), _arm("canary", 41))
    assert both.reason.startswith(
        "baseline has 10 of 250 judged requests; canary has 41 of 250 judged requests"
    )


def test_a_canary_without_judged_requests_waits() -> None:
    verdict = compare(_arm("base", 500), VersionWindow().stats("canary", now=0.0))
    assert verdict.result == "wait"
    assert "attainment: canary has no judged requests" in verdict.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_requests": 0}, "min_requests must be at least 1"),
        ({"min_latency_samples": 0}, "min_latency_samples must be at least 1"),
        ({"attainment_margin": -0.01}, r"attainment_margin must be in \[0, 1\)"),
        ({"attainment_margin": 1.0}, r"attainment_margin must be in \[0, 1\)"),
        ({"error_margin": 1.5}, r"error_margin must be in \[0, 1\)"),
        ({"latency_margin": -0.1}, "latency_margin must not be negative"),
        ({"latency_margin": math.inf}, "latency_margin must be finite"),
        ({"z": 0.0}, "z must be positive"),
        ({"z": math.nan}, "z must be finite"),
        ({"error_margin": math.nan}, "error_margin must be finite"),
    ],
)
def test_rule_validation_messages(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VerdictRule(**kwargs)  # type: ignore[arg-type]


def test_rule_allows_a_latency_margin_above_one() -> None:
    assert VerdictRule(latency_margin=2.0).latency_margin == 2.0


@pytest.mark.parametrize(("attainment", "error_rate"), [(0.99, 0.001), (0.95, 0.002)])
def test_an_equal_canary_judged_after_every_request_is_rarely_failed(
    attainment: float, error_rate: float
) -> None:
    """Repeated looks: an equal canary at 5% weight, judged after each of its requests up
    to `min_requests`, as the controller's ticks do; false fails stay rare (seeded)."""
    rng = random.Random(16)
    rule = VerdictRule()
    failed_rollouts = 0
    rollouts = 100
    for _ in range(rollouts):
        arms = {"base": [0, 0, 0], "canary": [0, 0, 0]}  # judged, met, failed

        def serve(arm: list[int]) -> None:
            u = rng.random()
            arm[0] += 1
            arm[1] += u < attainment
            arm[2] += u > 1 - error_rate

        for _ in range(rule.min_requests):
            for _ in range(19):
                serve(arms["base"])
            serve(arms["canary"])
            b, c = (_counts(k, *arms[k]) for k in ("base", "canary"))
            if compare(b, c, rule).result == "fail":
                failed_rollouts += 1
                break
    assert failed_rollouts <= 1, failed_rollouts


def _counts(version: str, judged: int, met: int, failed: int) -> VersionStats:
    """Stats with only the SLO counts (no latency figure: those checks wait)."""
    return VersionStats(
        version=version,
        requests=judged,
        judged=judged,
        failed=failed,
        met=met,
        error_rate=failed / judged if judged else None,
        attainment=met / judged if judged else None,
        ttft_per_uncached_token_s=None,
        ttft_samples=0,
        tpot_p50_s=None,
        tpot_samples=0,
        output_tokens_mean=None,
        output_tokens_p50=None,
        finish_reasons={},
    )
