"""A model's SLO, each request's verdict against it, goodput and error-budget burn.

Rule of this file: pure decisions over plain data on an injected clock. Definitions:
- A request *meets* the SLO when it completed and its own TTFT <= `ttft_s` and its TPOT
  <= `tpot_s`; this per-request rule is DistServe's (Zhong et al., OSDI 2024). A request
  whose engine sent each answer whole has no TTFT or TPOT and is judged on its end-to-end
  time against what the rule allows for its tokens (`judge`).
- It *misses* when it completed without meeting the rule, or the client closed it after
  the rule was already broken; it *failed* when the service failed it (`FAILED_OUTCOMES`,
  and 5xx refusals such as no replica). Requests the client ended in time or caused
  (client_closed, 4xx, 429 quota refusals) are outside the SLO.
- Goodput: met requests/s and their completion tokens/s. Attainment: met / judged.
- Burn rate over a window: (missed + failed) / judged, divided by the error budget
  `1 - objective`; 1.0 spends the budget exactly over the SLO period. The alert pairs are
  the SRE workbook's multiwindow, multi-burn-rate alerts (Beyer et al., *The Site
  Reliability Workbook*, ch. 5): page at 14.4x over 1 h and 5 min (2% of a 30-day budget
  in an hour), ticket at 6x over 6 h and 30 min (5% in 6 h).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from homing.obs.window import WindowedSums

Verdict = Literal["met", "missed", "failed"]

#: Outcomes that are the service's failure (see `homing.gateway.generation`).
FAILED_OUTCOMES = frozenset(
    {"engine_error", "timeout", "drained", "worker_drained", "worker_removed", "error"}
)

#: Burn-rate windows (name, seconds), as exported.
BURN_WINDOWS: tuple[tuple[str, float], ...] = (
    ("5m", 300.0),
    ("30m", 1800.0),
    ("1h", 3600.0),
    ("6h", 21600.0),
)

#: (severity, long window, short window, burn-rate threshold): both windows over it fire.
BURN_ALERTS: tuple[tuple[str, str, str, float], ...] = (
    ("page", "1h", "5m", 14.4),
    ("ticket", "6h", "30m", 6.0),
)

#: Window of the exported goodput rates and of attainment, seconds.
GOODPUT_WINDOW_S = 60.0
ATTAINMENT_WINDOW_S = 300.0


@dataclass(frozen=True)
class Slo:
    """A model's SLO: p95 targets, the per-request rule and the objective.

    `ttft_p95_s` / `tpot_p95_s`: targets for the p95 TTFT and TPOT (seconds; the seed's
    500 ms and 50 ms). `ttft_s` / `tpot_s`: the per-request rule (default: the p95
    targets). `objective`: the fraction of judged requests that must meet the rule (0.95
    with p95 targets: "95% of requests within both").
    """

    ttft_p95_s: float = 0.5
    tpot_p95_s: float = 0.05
    ttft_s: float | None = None
    tpot_s: float | None = None
    objective: float = 0.95

    @property
    def rule_ttft_s(self) -> float:
        """The per-request TTFT limit (seconds)."""
        return self.ttft_p95_s if self.ttft_s is None else self.ttft_s

    @property
    def rule_tpot_s(self) -> float:
        """The per-request TPOT limit (seconds)."""
        return self.tpot_p95_s if self.tpot_s is None else self.tpot_s

    @property
    def error_budget(self) -> float:
        """1 - objective: the fraction of judged requests allowed to miss."""
        return 1.0 - self.objective


def judge(
    slo: Slo,
    outcome: str,
    status: int | None,
    ttft_s: float | None,
    tpot_s: float | None,
    *,
    e2e_s: float | None = None,
    tokens_per_choice: float = 0.0,
    streamed: bool = True,
) -> Verdict | None:
    """The request's verdict, or None when it is outside the SLO (the client's doing).

    `outcome`: the request log's outcome ("ok" for a completed request); `status`: the
    HTTP status of a refusal (None otherwise). Times in seconds. A completed request whose
    tokens' times are unknown (its engine sent each answer whole: `ttft_s` None) is judged
    on `e2e_s` against the time the rule allows for `tokens_per_choice` tokens:
    `rule_ttft_s + rule_tpot_s * (tokens - 1)`. A request the client closed is missed when
    it had already broken the rule (no first token within `rule_ttft_s` of its arrival
    while its engine `streamed`, or a TPOT over the limit so far), else outside the SLO: a
    whole answer's allowance is not known until its length is.
    """
    if outcome == "ok":
        if ttft_s is None:
            if e2e_s is None:
                return "missed"
            allowed = slo.rule_ttft_s + slo.rule_tpot_s * max(0.0, tokens_per_choice - 1)
            return "met" if e2e_s <= allowed else "missed"
        if ttft_s > slo.rule_ttft_s:
            return "missed"
        if tpot_s is not None and tpot_s > slo.rule_tpot_s:
            return "missed"
        return "met"
    if outcome in FAILED_OUTCOMES:
        return "failed"
    if status is not None and status >= 500:
        return "failed"
    if outcome == "client_closed":
        waited = ttft_s if ttft_s is not None else (e2e_s if streamed else None)
        if waited is not None and waited > slo.rule_ttft_s:
            return "missed"
        if tpot_s is not None and tpot_s > slo.rule_tpot_s:
            return "missed"
    return None


@dataclass(frozen=True)
class SloStatus:
    """One model's SLO figures at a moment.

    `burn_rates`: window name -> burn rate (0 with no judged request). `alerts`: severity
    -> firing. `attainment`: met / judged over `ATTAINMENT_WINDOW_S` (1.0 with none).
    `goodput_rps` / `goodput_tps`: met requests/s and their completion tokens/s over
    `GOODPUT_WINDOW_S`. `judged_rps`: judged requests/s over that window.
    """

    burn_rates: dict[str, float]
    alerts: dict[str, bool]
    attainment: float
    goodput_rps: float
    goodput_tps: float
    judged_rps: float


class SloTracker:
    """Verdicts of one model's requests over a sliding window, and its `SloStatus`.

    `now`: the clock (seconds). `resolution_s`: the window's bucket (5 s: the 5-minute
    burn rate is exact to 1.7%). Memory: 6 h / `resolution_s` buckets of 4 floats.
    """

    _FIELDS = ("met", "missed", "failed", "met_tokens")

    def __init__(self, slo: Slo, *, now: Callable[[], float], resolution_s: float = 5.0) -> None:
        self.slo = slo
        self._sums = WindowedSums(
            self._FIELDS,
            now=now,
            horizon_s=max(s for _, s in BURN_WINDOWS),
            resolution_s=resolution_s,
        )

    def record(self, verdict: Verdict, completion_tokens: int) -> None:
        """Count one judged request."""
        self._sums.add(
            (
                verdict == "met",
                verdict == "missed",
                verdict == "failed",
                completion_tokens if verdict == "met" else 0,
            )
        )

    def burn_rate(self, window_s: float) -> float:
        """(missed + failed) / judged over the last `window_s`, over the error budget."""
        return self._burn(self._sums.sums(window_s))

    def _burn(self, s: dict[str, float]) -> float:
        judged = s["met"] + s["missed"] + s["failed"]
        if judged == 0 or self.slo.error_budget <= 0:
            return 0.0
        return (s["missed"] + s["failed"]) / judged / self.slo.error_budget

    def status(self) -> SloStatus:
        """Burn rates, alerts, attainment and goodput now (one pass over the buckets)."""
        windows = [s for _, s in BURN_WINDOWS] + [ATTAINMENT_WINDOW_S, GOODPUT_WINDOW_S]
        sums = self._sums.sums_many(windows)
        burns = {name: self._burn(sums[seconds]) for name, seconds in BURN_WINDOWS}
        alerts = {
            severity: burns[long] > threshold and burns[short] > threshold
            for severity, long, short, threshold in BURN_ALERTS
        }
        recent = sums[ATTAINMENT_WINDOW_S]
        judged = recent["met"] + recent["missed"] + recent["failed"]
        g = sums[GOODPUT_WINDOW_S]
        span = self._sums.span_s(GOODPUT_WINDOW_S)
        return SloStatus(
            burn_rates=burns,
            alerts=alerts,
            attainment=recent["met"] / judged if judged else 1.0,
            goodput_rps=g["met"] / span,
            goodput_tps=g["met_tokens"] / span,
            judged_rps=(g["met"] + g["missed"] + g["failed"]) / span,
        )
