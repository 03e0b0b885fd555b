"""The chaos suite's scenarios as plain data: which faults, on which workers, for how long.

Rule of this file: no I/O. A scenario is a list of `FaultPlan`s run at once; `phases`
splits a scenario's duration into load before the fault, the fault, and load after it.
Fault kinds (what the harness does; bodies are `POST /fault` of the worker's sidecar,
`homing.sim.faults`):

- "kill": SIGKILL of the worker's `homing sim` process; at the fault's end it is started
  again on the same port (the fault ends when it serves);
- "stall": `{"stall_s": FAULT}`: the engine runs no step for the fault's length;
- "slowdown": `{"slowdown": 10}`, then `{"slowdown": 1}` at the end;
- "restart": `{"restart": true}`: back on the same port with an empty cache (the fault
  ends when the sidecar answers, i.e. when the worker serves again);
- "flap": `{"health": false}` and `{"health": true}` by turns every `flap_period_s`,
  starting unhealthy, and healthy at the end;
- "reject": `{"reject": "UNAVAILABLE"}`, then `{"reject": null}` at the end.

"mixed" puts MIXED_KINDS on workers 0, 1, ... at once, leaving the last worker without a
fault (so another healthy worker always exists); every single-fault scenario targets
worker 0.
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_KINDS = ("kill", "stall", "slowdown", "restart", "flap", "reject")
SCENARIOS = (*FAULT_KINDS, "mixed")
"""Every scenario name, in the order the suite runs them."""

MIXED_KINDS = ("kill", "reject", "slowdown", "flap", "stall")
"""The faults of "mixed", one per worker, as many as there are workers but one."""

SLOWDOWN_FACTOR = 10.0
DEFAULT_FLAP_PERIOD_S = 2.0

PRE_SHARE, FAULT_SHARE = 0.15, 0.35
"""Shares of a scenario's duration before the fault and under it; the rest (half) is load
after the fault's end, counted from when it actually ended (and extended, see
RECOVERY_WAIT_S)."""

RECOVERY_WAIT_S = 15.0
"""The post-fault phase goes on, up to this long after a fault's end, until every faulty
worker that served requests before its fault has served one started after it: time for the
gateway to probe it healthy again (by default 2 probes 1 s apart) once its gRPC channel
reconnects (gRPC's connection backoff starts at 1 s and grows 1.6x a failed attempt)."""


@dataclass(frozen=True)
class FaultPlan:
    """Fault `kind` on worker `worker` (its index among the suite's workers)."""

    kind: str
    worker: int

    def label(self, worker_ids: list[str] | None = None) -> str:
        """'kill w0' (the gateway's id when known, else the index)."""
        name = worker_ids[self.worker] if worker_ids else f"#{self.worker}"
        return f"{self.kind} {name}"


@dataclass(frozen=True)
class Phases:
    """Seconds of load before the fault, the fault's planned length, and load after it."""

    pre_s: float
    fault_s: float
    post_s: float

    @property
    def total_s(self) -> float:
        return self.pre_s + self.fault_s + self.post_s


def phases(duration_s: float) -> Phases:
    """Split `duration_s` (> 0) by PRE_SHARE and FAULT_SHARE."""
    pre = duration_s * PRE_SHARE
    fault = duration_s * FAULT_SHARE
    return Phases(pre_s=pre, fault_s=fault, post_s=duration_s - pre - fault)


def plan(name: str, workers: int) -> list[FaultPlan]:
    """The faults of scenario `name` over `workers` (>= 1) workers; ValueError for an
    unknown name."""
    if name in FAULT_KINDS:
        return [FaultPlan(name, 0)]
    if name == "mixed":
        count = max(1, min(workers - 1, len(MIXED_KINDS)))
        return [FaultPlan(kind, i) for i, kind in enumerate(MIXED_KINDS[:count])]
    raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")


def flap_schedule(fault_s: float, period_s: float) -> list[tuple[float, bool]]:
    """(offset s, healthy) of the health flips of a "flap" fault of `fault_s`: unhealthy at
    0, flipped every `period_s`, healthy at `fault_s` (the end)."""
    flips: list[tuple[float, bool]] = []
    t, healthy = 0.0, False
    while t < fault_s:
        flips.append((t, healthy))
        t += period_s
        healthy = not healthy
    flips.append((fault_s, True))
    return flips
