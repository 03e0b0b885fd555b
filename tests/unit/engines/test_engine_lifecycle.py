"""The worker lifecycle state machine: the allowed moves, the refused ones and their
messages, and which phases take requests."""

from __future__ import annotations

import pytest

from homing.engines.lifecycle import (
    Action,
    IllegalTransition,
    Phase,
    accepts_requests,
    allowed,
    transition,
)

ALLOWED = {
    (Phase.JOINING, Action.JOINED): Phase.READY,
    (Phase.JOINING, Action.REFUSED): Phase.GONE,
    (Phase.JOINING, Action.DRAIN): Phase.DRAINING,
    (Phase.JOINING, Action.REMOVE): Phase.GONE,
    (Phase.READY, Action.CORDON): Phase.CORDONED,
    (Phase.READY, Action.DRAIN): Phase.DRAINING,
    (Phase.READY, Action.EJECT): Phase.EJECTED,
    (Phase.READY, Action.REMOVE): Phase.GONE,
    (Phase.CORDONED, Action.UNCORDON): Phase.READY,
    (Phase.CORDONED, Action.DRAIN): Phase.DRAINING,
    (Phase.CORDONED, Action.REMOVE): Phase.GONE,
    (Phase.DRAINING, Action.DRAINED): Phase.GONE,
    (Phase.DRAINING, Action.UNDRAIN): Phase.READY,
    (Phase.DRAINING, Action.REMOVE): Phase.GONE,
    (Phase.EJECTED, Action.READMIT): Phase.READY,
    (Phase.EJECTED, Action.CORDON): Phase.CORDONED,
    (Phase.EJECTED, Action.DRAIN): Phase.DRAINING,
    (Phase.EJECTED, Action.REMOVE): Phase.GONE,
}


@pytest.mark.parametrize(("move", "after"), ALLOWED.items(), ids=lambda v: str(v))
def test_each_allowed_move_leads_to_its_phase(move: tuple[Phase, Action], after: Phase) -> None:
    assert transition(*move) is after
    assert allowed(*move)


def test_every_other_move_is_refused_with_the_phase_named() -> None:
    refused = [(p, a) for p in Phase for a in Action if (p, a) not in ALLOWED]
    assert len(refused) == len(Phase) * len(Action) - len(ALLOWED)
    for phase, action in refused:
        assert not allowed(phase, action)
        with pytest.raises(IllegalTransition) as err:
            transition(phase, action)
        assert str(err.value) == f"cannot {action.value} a worker that is {phase.value}"


def test_gone_is_final() -> None:
    assert not any(allowed(Phase.GONE, a) for a in Action)


def test_only_ready_workers_take_requests() -> None:
    assert [p for p in Phase if accepts_requests(p)] == [Phase.READY]
