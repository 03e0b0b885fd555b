"""A model rollout's plan and state machine (pure): steps of canary weight, each baked, then
moved on by a passing verdict or rolled back by a failing one.

Rule of this file: `Rollout` holds plain, JSON-ready data (`to_dict` / `from_dict`, so a
restarted gateway resumes it where it was) and changes only through its methods, each
given the time `now` (Unix seconds: the state outlives the process). The weights it asks
for are `weights()`; whoever holds it applies them and persists it after every change.

Phases: "running" (the canary has `weight` percent and its step bakes), "paused" (the
weight holds, the step does not move on), "promoted" (the canary has 100%) and
"rolled_back" (the canary has 0%; `reason` says why). A step moves on when its bake time
(`bake_s`, counted from the step's start or the last resume) is over and the verdict
passes; reaching 100 promotes. A failing verdict rolls back at once, also while paused (a
pause holds the plan, not the safety net). The verdict is the caller's
(`homing.rollout.compare`), taken over the current step's samples only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from homing.config.rules import MAX_BAKE_S, check_steps, is_version_label

Phase = Literal["running", "paused", "promoted", "rolled_back"]
PHASES: tuple[Phase, ...] = ("running", "paused", "promoted", "rolled_back")

#: Events kept in a rollout's history (the newest; older ones are dropped).
HISTORY_KEPT = 50


class RolloutError(Exception):
    """An operation the rollout's phase does not allow (e.g. resuming a promoted one)."""


@dataclass
class Event:
    """One change of a rollout: `at` (Unix s), `event` (started, stepped, paused, resumed,
    promoted, rolled_back), the canary's `weight` after it (percent) and `reason`."""

    at: float
    event: str
    weight: float
    reason: str = ""


@dataclass
class Rollout:
    """One model's rollout of version `canary` against `baseline`.

    `steps`: canary weights in percent (`check_steps`); `step`: the index of the current
    one; `bake_s`: seconds each step bakes; `step_started_at`: Unix seconds its bake began.
    `phase`, `reason` (why it is where it is: the failing checks of a rollback, "promoted
    by operator", ...) and `history` (the newest HISTORY_KEPT events) as the module
    docstring says. `last_verdict`: the latest verdict's one-line reason ("" before one).
    """

    model: str
    baseline: str
    canary: str
    steps: list[float]
    bake_s: float
    step: int = 0
    phase: Phase = "running"
    step_started_at: float = 0.0
    reason: str = ""
    last_verdict: str = ""
    history: list[Event] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        model: str,
        baseline: str,
        canary: str,
        steps: Iterable[float],
        bake_s: float,
        now: float,
    ) -> Rollout:
        """A rollout at its first step from `now`. ValueError for bad steps, a `bake_s`
        outside [0, MAX_BAKE_S], or `canary` equal to `baseline`."""
        if canary == baseline:
            raise ValueError(f"the canary {canary!r} is the baseline")
        if not math.isfinite(bake_s) or not 0 <= bake_s <= MAX_BAKE_S:
            raise ValueError(f"bake_s must be in [0, {MAX_BAKE_S:g}] seconds, got {bake_s!r}")
        r = cls(model, baseline, canary, check_steps(steps), float(bake_s), step_started_at=now)
        r._log(now, "started", f"baseline {baseline}, steps {r.steps_text()}")
        return r

    # -- reading --

    @property
    def weight(self) -> float:
        """The canary's weight now, percent."""
        if self.phase == "rolled_back":
            return 0.0
        if self.phase == "promoted":
            return 100.0
        return self.steps[self.step]

    @property
    def active(self) -> bool:
        """Running or paused: it still decides the split."""
        return self.phase in ("running", "paused")

    def weights(self) -> dict[str, float]:
        """The split it asks for: version -> weight (percent)."""
        w = self.weight
        return {self.baseline: 100.0 - w, self.canary: w}

    def baked_s(self, now: float) -> float:
        """Seconds the current step has baked (0 when not running)."""
        return max(0.0, now - self.step_started_at) if self.phase == "running" else 0.0

    def steps_text(self) -> str:
        """The steps as "5,25,50,100"."""
        return ",".join(f"{s:g}" for s in self.steps)

    # -- changes --

    def observe(self, now: float, verdict: str, reason: str) -> bool:
        """Take a verdict ("pass", "fail" or "wait", with its one-line `reason`) at `now`:
        roll back on "fail" (running or paused), move to the next step on "pass" once the
        bake is over (running). True when the phase or the weight changed."""
        self.last_verdict = f"{verdict}: {reason}"
        if not self.active:
            return False
        if verdict == "fail":
            self._end(now, "rolled_back", reason)
            return True
        if verdict != "pass" or self.phase != "running" or self.baked_s(now) < self.bake_s:
            return False
        if self.step + 1 >= len(self.steps) or self.steps[self.step + 1] >= 100:
            self.step = len(self.steps) - 1
            self._end(now, "promoted", reason)
            return True
        self.step += 1
        self.step_started_at = now
        self._log(now, "stepped", reason)
        return True

    def pause(self, now: float) -> None:
        """Hold the current step. RolloutError unless running."""
        self._require(("running",), "pause")
        self.phase = "paused"
        self.reason = "paused by operator"
        self._log(now, "paused", self.reason)

    def resume(self, now: float) -> None:
        """Go on from a pause; the step's bake starts again at `now`. RolloutError unless
        paused."""
        self._require(("paused",), "resume")
        self.phase = "running"
        self.step_started_at = now
        self.reason = ""
        self._log(now, "resumed", "resumed by operator")

    def promote(self, now: float, reason: str = "promoted by operator") -> None:
        """Give the canary 100% now. RolloutError unless running or paused."""
        self._require(("running", "paused"), "promote")
        self.step = len(self.steps) - 1
        self._end(now, "promoted", reason)

    def rollback(self, now: float, reason: str = "rolled back by operator") -> None:
        """Give the canary 0% now. RolloutError unless running or paused."""
        self._require(("running", "paused"), "roll back")
        self._end(now, "rolled_back", reason)

    def _require(self, phases: tuple[Phase, ...], what: str) -> None:
        if self.phase not in phases:
            raise RolloutError(
                f"the rollout of {self.canary} is {self.phase.replace('_', ' ')}: it cannot {what}"
            )

    def _end(self, now: float, phase: Phase, reason: str) -> None:
        self.phase = phase
        self.reason = reason
        self._log(now, phase, reason)

    def _log(self, now: float, event: str, reason: str) -> None:
        self.history.append(Event(now, event, self.weight, reason))
        del self.history[:-HISTORY_KEPT]

    # -- persistence --

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (`from_dict` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rollout:
        """The rollout `to_dict` wrote; ValueError (or TypeError/KeyError wrapped in it)
        when `data` is not one."""
        try:
            phase = data["phase"]
            if phase not in PHASES:
                raise ValueError(f"unknown phase {phase!r}")
            steps = check_steps(data["steps"], need_baseline=False)  # an older plan reads
            step = int(data["step"])
            if not 0 <= step < len(steps):
                raise ValueError(f"step {step} is out of range")
            bake_s = _finite(data["bake_s"], "bake_s")
            if not 0 <= bake_s <= MAX_BAKE_S:
                raise ValueError(f"bake_s {bake_s!r} is outside [0, {MAX_BAKE_S:g}]")
            baseline, canary = _label(data["baseline"]), _label(data["canary"])
            if not canary or canary == baseline:
                raise ValueError("the canary is empty or the baseline")
            history = [
                Event(
                    _finite(e["at"], "an event's at"),
                    str(e["event"]),
                    _finite(e["weight"], "an event's weight"),
                    str(e.get("reason", "")),
                )
                for e in data.get("history", [])
            ]
            return cls(
                model=str(data["model"]),
                baseline=baseline,
                canary=canary,
                steps=steps,
                bake_s=bake_s,
                step=step,
                phase=phase,
                step_started_at=_finite(data["step_started_at"], "step_started_at"),
                reason=str(data.get("reason", "")),
                last_verdict=str(data.get("last_verdict", "")),
                history=history[-HISTORY_KEPT:],
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a stored rollout: {err}") from None


def _finite(value: Any, name: str) -> float:
    """`value` as a finite float; ValueError naming `name` otherwise (a bool is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r:.40}")
    return float(value)


def _label(value: Any) -> str:
    """`value` if it is a version label as stored (at most 128 printable ASCII characters)."""
    if not is_version_label(value):
        raise ValueError(f"{value!r:.60} is not a version label")
    return value
