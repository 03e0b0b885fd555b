"""A canary rollout's comparison: the canary version against the baseline over a sliding
window, and the verdict the rollout controller promotes or rolls back on.

Rule of this file: pure decisions over plain data; times are seconds on an injected clock,
passed in. `VersionWindow` keeps each version's ended requests (`Sample`); `stats` sums them
into `VersionStats`; `compare` judges a canary's stats against the baseline's (`Verdict`).

The checks (`VerdictRule` holds the constants):
- Sample size: each version needs `min_requests` (250) judged requests before a pass; short
  of it the verdict waits, except that a check's fail counts at once (a badly broken canary
  is rolled back without waiting for 250 requests), once both versions have
  `min_fail_requests` (30) judged requests (the normal interval means nothing at a handful).
- Error rate (failed / judged; the canary is worse when higher) and attainment (met /
  judged; worse when lower): a non-inferiority test (as in clinical trials, ICH E9) on the
  difference d = p_canary - p_baseline, with the Agresti–Caffo interval (Agresti & Caffo,
  "Simple and effective confidence intervals for proportions and differences of
  proportions", The American Statistician 54(4), 2000): add one success and one failure to
  each group, p~ = (x + 1) / (n + 2), d~ = p~c - p~b,
  SE = sqrt(p~c (1 - p~c) / (nc + 2) + p~b (1 - p~b) / (nb + 2)). Attainment fails when the
  upper bound d~ + z SE < -`attainment_margin` (worse by more than the margin, beyond
  doubt), passes when the lower bound d~ - z SE >= -margin (not worse by more than it), and
  waits otherwise; error rate is the mirror (fail when d~ - z SE > `error_margin`, pass when
  d~ + z SE <= it). `z` 1.645: the one-sided 95% normal quantile. Margins: 2 points of
  attainment and 1 point of error rate (two fifths and one fifth of a 0.95 objective's 5%
  error budget); a policy choice, not taken from a published source.
  When the interval is too wide to pass: with equal arms of n judged requests each at
  proportion p, a pass needs z SE <= margin, about n >= 2 z² p (1 - p) / margin² (plus
  the Agresti–Caffo pseudo-counts). Attainment at a 2-point margin passes from n = 198 at
  p = 0.99, 650 at 0.95, 1222 at 0.90; error rate at a 1-point margin from n = 231 with no
  errors at all, 400 at 0.5% and 610 at 1%. Until the window holds that many, the check
  waits; `min_requests` = 250 is past both 198 and 231, so equal arms with few errors pass
  once each version has it (a lower attainment needs more, and more canary traffic
  shortens the wait).
  A fail takes the stricter `fail_z` 2.576 (one-sided 99.5%): the controller looks at every
  tick as the window fills, and repeated looks at one level add up (Armitage, McPherson &
  Rowe, "Repeated significance tests on accumulating data", JRSS A 132, 1969); a constant,
  stricter boundary is Pocock's answer (Biometrika 64, 1977). An equal canary at 5%
  weight, judged after every one of its requests up to 250: falsely failed in 0 of 400
  seeded rollouts at 99% and at 95% attainment and in 2 of 400 at 90%, against 2.5%, 18%
  and 21% with the pass bound and no floor (tests/unit/rollout/test_compare.py checks
  the first two).
- Latency: TTFT per uncached prompt token (the ratio of sums `homing.obs.replica` uses, over
  requests with at least `MIN_UNCACHED_TOKENS` uncached tokens, so a canary with a cold
  cache is not judged by its cache misses) and the median TPOT. The canary fails when its
  figure is more than `latency_margin` (25%) above the baseline's, else passes; it waits
  while either version has fewer than `min_latency_samples` (30) requests with the figure,
  and passes as "not compared" when both versions have `min_requests` judged requests but
  still too few with the figure (short or cached prompts may never give enough).
  No interval here: the point figures are compared as they are, and 30 samples is a floor,
  not a confidence level (25% and 30 are policy choices, not from a published source). A
  baseline figure of 0 passes a canary at 0 and fails any other (the ratio is infinite).
- Overall: "fail" when any check fails; else "wait" when either version has under
  `min_requests` judged requests or any check waits; else "pass".
- Output length and finish reasons are reported in `VersionStats`, not judged: a new model
  may rightly answer at another length or stop differently.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

Judgement = Literal["pass", "fail", "wait"]

#: Uncached prompt tokens a request needs to count in TTFT per uncached token: from 256 on,
#: prefill dominates TTFT (an H100 prefills 256 tokens of an 8B model in ~20 ms, about one
#: decode step); the same threshold as `homing.engines.outliers.OutlierConfig`.
MIN_UNCACHED_TOKENS = 256


@dataclass(frozen=True)
class Sample:
    """One ended request served by one version.

    `at`: clock seconds when it ended. `verdict`: its SLO verdict ("met", "missed",
    "failed"), or None when outside the SLO (the client's doing). `ttft_s`: seconds from
    routing to its first token on the worker (None: no first token, or not streamed).
    `uncached_tokens`: prompt tokens not served from the worker's cache. `tpot_s`: seconds
    per output token after the first (None: unknown). `finish_reason`: "stop", "length",
    ... ("" when none).
    """

    at: float
    verdict: str | None
    ttft_s: float | None
    uncached_tokens: int
    tpot_s: float | None
    completion_tokens: int
    finish_reason: str


@dataclass(frozen=True)
class VersionStats:
    """One version's figures over its samples in a window.

    `requests`: samples; `judged`: those with a verdict; `failed` / `met`: verdict counts.
    `error_rate` = failed / judged and `attainment` = met / judged (None when judged is 0).
    `ttft_per_uncached_token_s`: sum of TTFT / sum of uncached tokens (seconds per token)
    over the `ttft_samples` samples with a TTFT and at least the window's minimum uncached
    tokens (None when none). `tpot_p50_s`: median TPOT (seconds) of the `tpot_samples`
    samples with one. `output_tokens_mean` / `output_tokens_p50`: completion tokens over all
    samples (None when none). `finish_reasons`: reason -> share of samples (sums to 1; {}
    when none; "" for samples without one).
    """

    version: str
    requests: int
    judged: int
    failed: int
    met: int
    error_rate: float | None
    attainment: float | None
    ttft_per_uncached_token_s: float | None
    ttft_samples: int
    tpot_p50_s: float | None
    tpot_samples: int
    output_tokens_mean: float | None
    output_tokens_p50: float | None
    finish_reasons: dict[str, float] = field(default_factory=dict)


class VersionWindow:
    """Each version's samples of the last `window_s` seconds (a deque per version; samples at
    or before `now - window_s` are dropped on `add`, against the newest sample's time, and on
    `stats`). `max_samples` per version (5,000: twenty times the default `min_requests`,
    and `stats` over it takes a few milliseconds) bounds memory and the cost of a verdict:
    past it the oldest go first, so a busy baseline's figures cover its latest 5,000
    requests of the window.
    `min_uncached_tokens`: see `MIN_UNCACHED_TOKENS`. ValueError for a `window_s` that is
    not positive and finite, or a `max_samples` or `min_uncached_tokens` under 1.
    """

    def __init__(
        self,
        window_s: float = 600.0,
        max_samples: int = 5_000,
        *,
        min_uncached_tokens: int = MIN_UNCACHED_TOKENS,
    ) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be positive and finite, got {window_s!r}")
        if max_samples < 1:
            raise ValueError(f"max_samples must be at least 1, got {max_samples!r}")
        if min_uncached_tokens < 1:
            raise ValueError(f"min_uncached_tokens must be at least 1, got {min_uncached_tokens!r}")
        self.window_s = window_s
        self.max_samples = max_samples
        self.min_uncached_tokens = min_uncached_tokens
        self._samples: dict[str, deque[Sample]] = {}

    def add(self, version: str, sample: Sample) -> None:
        """Keep one ended request of `version`."""
        samples = self._samples.get(version)
        if samples is None:
            samples = self._samples[version] = deque(maxlen=self.max_samples)
        samples.append(sample)
        self._drop(samples, sample.at)

    def _drop(self, samples: deque[Sample], now: float) -> None:
        cutoff = now - self.window_s
        while samples and samples[0].at <= cutoff:
            samples.popleft()

    def stats(self, version: str, now: float, since: float | None = None) -> VersionStats:
        """`version`'s figures over its samples with `at > now - window_s` and, when `since`
        is given, `at >= since` (seconds; e.g. since the canary's last weight change). An
        unknown version has zero requests."""
        samples = self._samples.get(version)
        if samples is None:
            return _summarise(version, [], self.min_uncached_tokens)
        self._drop(samples, now)
        cutoff = now - self.window_s
        kept = [s for s in samples if s.at > cutoff and (since is None or s.at >= since)]
        return _summarise(version, kept, self.min_uncached_tokens)

    def full_since(self, version: str) -> float | None:
        """The time of `version`'s oldest sample kept when its `max_samples` are all taken
        (older ones were dropped, so its figures start there); None while it has room."""
        samples = self._samples.get(version)
        if samples is None or len(samples) < self.max_samples:
            return None
        return samples[0].at

    def versions(self) -> list[str]:
        """The versions with samples kept (in the order first seen)."""
        return [v for v, samples in self._samples.items() if samples]

    def forget(self, version: str) -> None:
        """Drop a version's samples (it left the rollout)."""
        self._samples.pop(version, None)

    def clear(self) -> None:
        """Drop every version's samples."""
        self._samples.clear()


def _summarise(version: str, samples: list[Sample], min_uncached_tokens: int) -> VersionStats:
    judged = failed = met = 0
    ttft_sum = 0.0
    uncached_sum = 0
    ttft_samples = 0
    tpots: list[float] = []
    reasons: dict[str, int] = {}
    for s in samples:
        if s.verdict is not None:
            judged += 1
            failed += s.verdict == "failed"
            met += s.verdict == "met"
        if s.ttft_s is not None and s.uncached_tokens >= min_uncached_tokens:
            ttft_sum += s.ttft_s
            uncached_sum += s.uncached_tokens
            ttft_samples += 1
        if s.tpot_s is not None:
            tpots.append(s.tpot_s)
        reasons[s.finish_reason] = reasons.get(s.finish_reason, 0) + 1
    n = len(samples)
    tokens = [s.completion_tokens for s in samples]
    return VersionStats(
        version=version,
        requests=n,
        judged=judged,
        failed=failed,
        met=met,
        error_rate=failed / judged if judged else None,
        attainment=met / judged if judged else None,
        ttft_per_uncached_token_s=ttft_sum / uncached_sum if uncached_sum else None,
        ttft_samples=ttft_samples,
        tpot_p50_s=statistics.median(tpots) if tpots else None,
        tpot_samples=len(tpots),
        output_tokens_mean=sum(tokens) / n if n else None,
        output_tokens_p50=float(statistics.median(tokens)) if n else None,
        finish_reasons={reason: count / n for reason, count in reasons.items()},
    )


@dataclass(frozen=True)
class VerdictRule:
    """The constants of the comparison (the module docstring gives each one's meaning and
    source). Margins are fractions (0.02: 2 points); `latency_margin` is a fraction of the
    baseline's figure. ValueError for a value out of range or not finite."""

    min_requests: int = 250
    attainment_margin: float = 0.02
    error_margin: float = 0.01
    latency_margin: float = 0.25
    min_latency_samples: int = 30
    z: float = 1.645
    min_fail_requests: int = 30
    fail_z: float = 2.576

    def __post_init__(self) -> None:
        for name in ("attainment_margin", "error_margin", "latency_margin", "z", "fail_z"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if self.min_requests < 1:
            raise ValueError(f"min_requests must be at least 1, got {self.min_requests!r}")
        if self.min_latency_samples < 1:
            raise ValueError(
                f"min_latency_samples must be at least 1, got {self.min_latency_samples!r}"
            )
        for name in ("attainment_margin", "error_margin"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.latency_margin < 0:
            raise ValueError(f"latency_margin must not be negative, got {self.latency_margin!r}")
        if self.z <= 0:
            raise ValueError(f"z must be positive, got {self.z!r}")
        if self.fail_z < self.z:
            raise ValueError(f"fail_z must be at least z ({self.z!r}), got {self.fail_z!r}")
        if self.min_fail_requests < 1:
            raise ValueError(
                f"min_fail_requests must be at least 1, got {self.min_fail_requests!r}"
            )


@dataclass(frozen=True)
class Check:
    """One check's result. `name`: "error_rate", "attainment", "ttft_per_uncached_token" or
    "tpot"; `baseline` / `canary`: each version's figure (a fraction, or seconds; None when
    it has none); `detail`: one line a person can read."""

    name: str
    result: Judgement
    baseline: float | None
    canary: float | None
    detail: str


@dataclass(frozen=True)
class Verdict:
    """The comparison's result. `reason`: one line; for a fail, the failing checks' details
    joined with "; "; for a wait, what sample is missing (each version short of
    `min_requests`, then the waiting checks' details); for a pass, "all checks pass"."""

    result: Judgement
    reason: str
    checks: tuple[Check, ...]
    baseline: VersionStats
    canary: VersionStats


def compare(
    baseline: VersionStats, canary: VersionStats, rule: VerdictRule = VerdictRule()
) -> Verdict:
    """Judge `canary` against `baseline` by `rule` (see the module docstring)."""
    checks = (
        _proportion(
            "error_rate",
            "error rate",
            (baseline.failed, baseline.judged),
            (canary.failed, canary.judged),
            rule.error_margin,
            higher_is_worse=True,
            rule=rule,
        ),
        _proportion(
            "attainment",
            "attainment",
            (baseline.met, baseline.judged),
            (canary.met, canary.judged),
            rule.attainment_margin,
            higher_is_worse=False,
            rule=rule,
        ),
        _latency(
            "ttft_per_uncached_token",
            "TTFT per uncached token",
            (baseline.ttft_per_uncached_token_s, baseline.ttft_samples),
            (canary.ttft_per_uncached_token_s, canary.ttft_samples),
            rule,
        ),
        _latency(
            "tpot",
            "TPOT p50",
            (baseline.tpot_p50_s, baseline.tpot_samples),
            (canary.tpot_p50_s, canary.tpot_samples),
            rule,
        ),
    )
    if min(baseline.judged, canary.judged) >= rule.min_requests:
        checks = tuple(_uncompared(c, rule) for c in checks)
    failing = [c.detail for c in checks if c.result == "fail"]
    if failing:
        return Verdict("fail", "; ".join(failing), checks, baseline, canary)
    short = [
        f"{label} has {stats.judged} of {rule.min_requests} judged requests"
        for label, stats in (("baseline", baseline), ("canary", canary))
        if stats.judged < rule.min_requests
    ]
    waiting = short + [c.detail for c in checks if c.result == "wait"]
    if waiting:
        return Verdict("wait", "; ".join(waiting), checks, baseline, canary)
    return Verdict("pass", "all checks pass", checks, baseline, canary)


def _uncompared(check: Check, rule: VerdictRule) -> Check:
    """A latency check still short of samples once both versions have `min_requests`
    judged requests passes as not compared (a workload of short or cached prompts may
    never give the TTFT figure enough samples)."""
    if check.result != "wait" or check.name not in ("ttft_per_uncached_token", "tpot"):
        return check
    return Check(check.name, "pass", check.baseline, check.canary, f"not compared: {check.detail}")


def _points(fraction: float, *, sign: bool = False) -> str:
    value = fraction * 100
    text = f"{value:+.1f}" if sign else f"{value:.1f}"
    return f"{text} point" if abs(value) == 1 else f"{text} points"


def _proportion(
    name: str,
    label: str,
    baseline: tuple[int, int],
    canary: tuple[int, int],
    margin: float,
    *,
    higher_is_worse: bool,
    rule: VerdictRule,
) -> Check:
    """The Agresti–Caffo non-inferiority check of one proportion (module docstring);
    `baseline` / `canary`: (count, judged requests). It passes on the `z` bound and fails on
    the stricter `fail_z` one, and only once both versions have `min_fail_requests`."""
    (xb, nb), (xc, nc) = baseline, canary
    p_baseline = xb / nb if nb else None
    p_canary = xc / nc if nc else None
    if p_baseline is None or p_canary is None:
        who = "baseline" if p_baseline is None else "canary"
        return Check(name, "wait", p_baseline, p_canary, f"{label}: {who} has no judged requests")
    pb = (xb + 1) / (nb + 2)
    pc = (xc + 1) / (nc + 2)
    se = math.sqrt(pc * (1 - pc) / (nc + 2) + pb * (1 - pb) / (nb + 2))
    d = pc - pb
    may_fail = min(nb, nc) >= rule.min_fail_requests
    if higher_is_worse:  # near: the bound toward "worse"; far: the one toward "better"
        near, far = d - rule.fail_z * se, d + rule.z * se
        fails, passes = may_fail and near > margin, far <= margin
    else:
        near, far = d + rule.fail_z * se, d - rule.z * se
        fails, passes = may_fail and near < -margin, far >= -margin
    result: Judgement = "fail" if fails else "pass" if passes else "wait"
    within = f"by more than {_points(margin)}"
    verdict = {
        "fail": f"worse {within}",
        "pass": f"not worse {within}",
        "wait": f"interval too wide to show it is not worse {within}",
    }[result]
    bound, z = (near, rule.fail_z) if fails else (far, rule.z)
    confidence = f"{statistics.NormalDist().cdf(z) * 100:.3g}%"
    head = f"{label} canary {p_canary:.3f} vs baseline {p_baseline:.3f}"
    return Check(
        name,
        result,
        p_baseline,
        p_canary,
        f"{head}: {verdict} ({confidence} bound {_points(bound, sign=True)})",
    )


def _latency(
    name: str,
    label: str,
    baseline: tuple[float | None, int],
    canary: tuple[float | None, int],
    rule: VerdictRule,
) -> Check:
    """The ratio check of one latency figure (module docstring)."""
    (fb, nb), (fc, nc) = baseline, canary
    for who, n in (("baseline", nb), ("canary", nc)):
        if n < rule.min_latency_samples:
            return Check(
                name, "wait", fb, fc, f"{who} has {n} of {rule.min_latency_samples} {label} samples"
            )
    if fb is None or fc is None:  # not reached with samples; for the type checker
        return Check(name, "wait", fb, fc, f"no {label} figure")
    if fb > 0:
        ratio = fc / fb
    else:
        ratio = 1.0 if fc == 0 else math.inf
    limit = 1 + rule.latency_margin
    result: Judgement = "fail" if ratio > limit else "pass"
    over = "over" if result == "fail" else "within"
    return Check(
        name,
        result,
        fb,
        fc,
        f"{label} canary {fc:.4g} s vs baseline {fb:.4g} s: {ratio:.2f}x, "
        f"{over} the {limit:.2f}x limit",
    )
