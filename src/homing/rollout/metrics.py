"""Rollout and version-split series, per model.

`homing_version_weight{model,version}`: each version's share of new sessions under the
split, percent (no series for a model without a split);
`homing_rollout_phase{model,canary,phase}`: 1 for the phase of the model's latest rollout
("running", "paused", "promoted", "rolled_back"), 0 for the others;
`homing_rollout_canary_weight{model,canary}`: the canary's weight now, percent;
`homing_rollout_verdicts_total{model,result}`: verdicts taken ("pass", "fail", "wait");
`homing_rollout_rollbacks_total{model,check}`: rollbacks by the check that failed first
("operator" for a manual one); `homing_rollout_version_{attainment,error_ratio}` and
`homing_rollout_version_{ttft_per_uncached_token,tpot_p50}_seconds{model,version}`: the
latest comparison's figures per version (no series while a figure has no data).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from homing.rollout.plan import PHASES


class RolloutMetrics:
    """The series above, registered once on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._canaries: dict[str, str] = {}  # the canary whose phase series each model has
        self._figured: dict[str, set[tuple[str, str]]] = {}  # (figure, version) exported
        self.weight = Gauge(
            "homing_version_weight",
            "A version's share of new sessions under the model's split, percent.",
            ["model", "version"],
            registry=registry,
        )
        self.phase = Gauge(
            "homing_rollout_phase",
            "1 for the phase of the model's latest rollout (running, paused, promoted, "
            "rolled_back).",
            ["model", "canary", "phase"],
            registry=registry,
        )
        self.canary_weight = Gauge(
            "homing_rollout_canary_weight",
            "The rollout's canary weight now, percent.",
            ["model", "canary"],
            registry=registry,
        )
        self.verdicts = Counter(
            "homing_rollout_verdicts",
            "Rollout verdicts taken, by result (pass, fail, wait).",
            ["model", "result"],
            registry=registry,
        )
        self.rollbacks = Counter(
            "homing_rollout_rollbacks",
            "Rollouts rolled back, by the check that failed first (operator: by hand).",
            ["model", "check"],
            registry=registry,
        )
        self.figures = {
            name: Gauge(
                f"homing_rollout_version_{name}",
                doc,
                ["model", "version"],
                registry=registry,
            )
            for name, doc in (
                ("attainment", "SLO attainment of the version over the comparison window."),
                ("error_ratio", "Failed / judged requests of the version over the window."),
                (
                    "ttft_per_uncached_token_seconds",
                    "Routing-to-first-token seconds per uncached prompt token (ratio of sums).",
                ),
                ("tpot_p50_seconds", "Median TPOT of the version over the window."),
            )
        }

    def set_split(self, model: str, shares: dict[str, float], before: set[str]) -> set[str]:
        """Export `shares` (version -> fraction) of `model`; series of versions in `before`
        but not in `shares` are removed. Returns the versions exported."""
        for version in before - set(shares):
            self.weight.remove(model, version)
        for version, share in shares.items():
            self.weight.labels(model, version).set(100.0 * share)
        return set(shares)

    def set_phase(self, model: str, canary: str, phase: str, weight: float) -> None:
        """The rollout of `canary` is in `phase` with `weight` percent; the series of the
        model's earlier rollout of another canary go."""
        before = self._canaries.get(model)
        if before is not None and before != canary:
            for p in PHASES:
                self.phase.remove(model, before, p)
            self.canary_weight.remove(model, before)
        self._canaries[model] = canary
        for p in PHASES:
            self.phase.labels(model, canary, p).set(1.0 if p == phase else 0.0)
        self.canary_weight.labels(model, canary).set(weight)

    def clear_figures(self, model: str) -> None:
        """Remove every comparison figure of `model` (its rollout ended)."""
        for name, version in self._figured.pop(model, set()):
            self.set_figure(name, model, version, None)

    def set_figure(self, name: str, model: str, version: str, value: float | None) -> None:
        """One comparison figure (`figures` key) of `version`; None removes its series."""
        gauge = self.figures[name]
        if value is None:
            try:
                gauge.remove(model, version)
            except KeyError:
                pass
        else:
            gauge.labels(model, version).set(value)
            self._figured.setdefault(model, set()).add((name, version))
