"""A worker's lifecycle in its pool, as one pure state machine.

    joining --joined--> ready --cordon--> cordoned --uncordon--> ready
    joining|ready|cordoned|ejected --drain--> draining --drained--> gone
    draining --undrain--> ready (the pool then cordons one whose drain began cordoned)
    ready --eject--> ejected --readmit--> ready     ejected --cordon--> cordoned
    joining --refused--> gone        any phase but gone --remove--> gone

`joining`: found (config or admin API), not yet discovered as a worker of the pool's model,
healthy and subscribed to. `ready`: takes new requests while healthy. `cordoned`: takes no
new requests and stays. `draining`: takes no new requests; leaves (`drained`) when its last
request ends, unless `undrain` calls the drain off first (it serves again as `ready`).
`ejected`: taken out by outlier detection, may be readmitted (an operator's cordon takes it
over: the worker stays out until uncordoned). `gone`: left the pool for good; the same URL
added again is a new worker with a new id.

Health is separate: a `ready` worker that fails its probes stays `ready` and gets no
requests until it is healthy again (`accepts_requests` and `WorkerState.healthy` both hold).
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """Where a worker is in its lifecycle (see the module docstring)."""

    JOINING = "joining"
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    EJECTED = "ejected"
    GONE = "gone"


class Action(StrEnum):
    """What moves a worker from one phase to another."""

    JOINED = "joined"
    REFUSED = "refused"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    DRAIN = "drain"
    DRAINED = "drained"
    UNDRAIN = "undrain"
    EJECT = "eject"
    READMIT = "readmit"
    REMOVE = "remove"


_NEXT: dict[tuple[Phase, Action], Phase] = {
    (Phase.JOINING, Action.JOINED): Phase.READY,
    (Phase.JOINING, Action.REFUSED): Phase.GONE,
    (Phase.READY, Action.CORDON): Phase.CORDONED,
    (Phase.CORDONED, Action.UNCORDON): Phase.READY,
    (Phase.READY, Action.EJECT): Phase.EJECTED,
    (Phase.EJECTED, Action.READMIT): Phase.READY,
    (Phase.EJECTED, Action.CORDON): Phase.CORDONED,
    (Phase.DRAINING, Action.DRAINED): Phase.GONE,
    (Phase.DRAINING, Action.UNDRAIN): Phase.READY,
    **{(p, Action.DRAIN): Phase.DRAINING for p in (Phase.JOINING, Phase.READY, Phase.CORDONED)},
    (Phase.EJECTED, Action.DRAIN): Phase.DRAINING,
    **{(p, Action.REMOVE): Phase.GONE for p in Phase if p is not Phase.GONE},
}


class IllegalTransition(Exception):
    """`action` is not allowed in `phase`; the message says so in words a person can act on."""

    def __init__(self, phase: Phase, action: Action) -> None:
        self.phase = phase
        self.action = action
        super().__init__(f"cannot {action.value} a worker that is {phase.value}")


def transition(phase: Phase, action: Action) -> Phase:
    """The phase `action` leads to from `phase`; raises `IllegalTransition` when it is not
    allowed there (e.g. cordoning a draining worker)."""
    try:
        return _NEXT[(phase, action)]
    except KeyError:
        raise IllegalTransition(phase, action) from None


def allowed(phase: Phase, action: Action) -> bool:
    """Whether `action` is allowed in `phase`."""
    return (phase, action) in _NEXT


def accepts_requests(phase: Phase) -> bool:
    """Whether a worker in `phase` may be sent new requests (while healthy): only `ready`."""
    return phase is Phase.READY
