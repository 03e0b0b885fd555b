"""Fault injection of one simulated worker: the `POST /fault` body, validated, and the state
the worker's engine and servicer read.

Rule of this file: plain data and validation only. `parse_fault` turns a decoded JSON value
into a `Fault` or raises `FaultError` with a message for the client (the sidecar answers 400);
`FaultState` holds what is in force. Acting on a fault (pausing the engine, restarting the
server) is the worker's job (`homing.sim.worker`).

Accepted bodies (one JSON object):
- `{"slowdown": K}`: every step takes K times its modelled time (K > 0; 1 is normal speed);
- `{"stall_s": S}`: the engine runs no step for S wall seconds (S >= 0); HealthCheck waits
  for it like SGLang's probe request would;
- `{"health": false}` / `{"health": true}`: HealthCheck (and grpc.health.v1) report
  unhealthy / healthy; requests are still served;
- `{"reject": "UNAVAILABLE"}` or `{"reject": "RESOURCE_EXHAUSTED"}`: every Generate is refused
  with that status; `{"reject": null}` stops refusing;
- `{"report_kv_usage": U}`: every load record (EngineLoad `token_usage` and
  `active_token_usage`, GetLoads' `token_usage`) reports KV utilisation U in [0, 1] instead
  of the real figure, the shape of an engine whose pool stays full of retained cache while
  it runs nothing; requests are served as before. `{"report_kv_usage": null}` reports the
  real figure again;
- `{"crash": true}`: the worker dies at once (no goodbye to its clients);
- `{"restart": true}`: the worker comes back on the same port with an empty cache and a new
  KV-event sequence (faults cleared, as a fresh process would have them);
- `{"clear": true}`: the prefix cache is flushed (an AllBlocksCleared event) once idle;
- `{}`: every fault above that is in force is cleared.
The first five may be combined in one body; crash, restart and clear stand alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

REJECT_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
"""gRPC status codes `{"reject": ...}` accepts (SGLang's 503 and 429 mappings)."""

STATE_KEYS = frozenset({"slowdown", "stall_s", "health", "reject", "report_kv_usage"})
ACTION_KEYS = frozenset({"crash", "restart", "clear"})


class FaultError(ValueError):
    """A fault body the worker refuses; the message says why (HTTP 400)."""


@dataclass(frozen=True)
class Fault:
    """One validated `POST /fault` body. `reset` is True for `{}`; the others are None when
    the body did not name them (for `reject` and `report_kv_usage`, `clear_reject` and
    `clear_report_kv_usage` tell an explicit null)."""

    reset: bool = False
    slowdown: float | None = None
    stall_s: float | None = None
    health: bool | None = None
    reject: str | None = None
    clear_reject: bool = False
    report_kv_usage: float | None = None
    clear_report_kv_usage: bool = False
    crash: bool = False
    restart: bool = False
    clear: bool = False


@dataclass
class FaultState:
    """Faults in force. `stall_until` is in the worker clock's seconds (0: no stall);
    `report_kv_usage` None: load records carry the real KV utilisation."""

    slowdown: float = 1.0
    stall_until: float = 0.0
    healthy: bool = True
    reject: str | None = None
    report_kv_usage: float | None = None

    def reset(self) -> None:
        """Back to a healthy worker at normal speed."""
        self.slowdown = 1.0
        self.stall_until = 0.0
        self.healthy = True
        self.reject = None
        self.report_kv_usage = None

    def apply(self, fault: Fault, now: float) -> None:
        """Put the state parts of `fault` in force at clock time `now` (seconds)."""
        if fault.reset:
            self.reset()
        if fault.slowdown is not None:
            self.slowdown = fault.slowdown
        if fault.stall_s is not None:
            self.stall_until = now + fault.stall_s
        if fault.health is not None:
            self.healthy = fault.health
        if fault.reject is not None or fault.clear_reject:
            self.reject = fault.reject
        if fault.report_kv_usage is not None or fault.clear_report_kv_usage:
            self.report_kv_usage = fault.report_kv_usage

    def kv_usage(self, actual: float) -> float:
        """The KV utilisation a load record reports when the engine's is `actual`."""
        return actual if self.report_kv_usage is None else self.report_kv_usage

    def stalled(self, now: float) -> bool:
        """True while a stall is in force at clock time `now`."""
        return now < self.stall_until

    def as_dict(self, now: float) -> dict[str, object]:
        """The state as the sidecar reports it (stall as seconds left)."""
        return {
            "slowdown": self.slowdown,
            "stall_s": max(self.stall_until - now, 0.0),
            "health": self.healthy,
            "reject": self.reject,
            "report_kv_usage": self.report_kv_usage,
        }


def parse_fault(body: object) -> Fault:
    """Validate a decoded `POST /fault` body (see the module docstring); raises FaultError."""
    if not isinstance(body, dict):
        raise FaultError(f"the fault body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - STATE_KEYS - ACTION_KEYS)
    if unknown:
        raise FaultError(
            f"unknown fault key(s) {unknown}; known: {sorted(STATE_KEYS | ACTION_KEYS)}"
        )
    if not body:
        return Fault(reset=True)
    actions = set(body) & ACTION_KEYS
    if actions and len(body) > 1:
        raise FaultError(f"{sorted(actions)[0]!r} must be the only key of a fault body")
    for key in actions:
        if body[key] is not True:
            raise FaultError(f"{key!r} must be true, got {body[key]!r}")
        return Fault(**{key: True})
    slowdown = body.get("slowdown")
    if "slowdown" in body and not (_is_number(slowdown) and 0 < float(slowdown) < math.inf):
        raise FaultError(f"'slowdown' must be a finite number > 0, got {slowdown!r}")
    stall_s = body.get("stall_s")
    if "stall_s" in body and not (_is_number(stall_s) and 0 <= float(stall_s) < math.inf):
        raise FaultError(f"'stall_s' must be a finite number of seconds >= 0, got {stall_s!r}")
    health = body.get("health")
    if "health" in body and not isinstance(health, bool):
        raise FaultError(f"'health' must be true or false, got {health!r}")
    reject = body.get("reject")
    if "reject" in body and reject is not None and reject not in REJECT_CODES:
        raise FaultError(f"'reject' must be one of {list(REJECT_CODES)} or null, got {reject!r}")
    usage = body.get("report_kv_usage")
    if usage is not None and not (_is_number(usage) and 0 <= float(usage) <= 1):
        raise FaultError(f"'report_kv_usage' must be a number in [0, 1] or null, got {usage!r}")
    return Fault(
        slowdown=float(slowdown) if slowdown is not None else None,
        stall_s=float(stall_s) if stall_s is not None else None,
        health=health,
        reject=reject,
        clear_reject="reject" in body and reject is None,
        report_kv_usage=float(usage) if usage is not None else None,
        clear_report_kv_usage="report_kv_usage" in body and usage is None,
    )


def _is_number(value: object) -> bool:
    """A JSON number that converts to a float (a 400-digit integer does not: OverflowError)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True
