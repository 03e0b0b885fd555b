"""The global GPU budget: scale-ups trimmed, warm before ready, never below what a pool has."""

from __future__ import annotations

from homing.scaler.budget import apportion
from homing.scaler.policy import Decision, ScalerChain


def want(ready: int, warm: int = 0) -> Decision:
    return Decision(ready, warm, "scale_up", False, ScalerChain(raw=float(ready)))


def sizes(out: dict[str, Decision]) -> dict[str, tuple[int, int]]:
    return {p: (d.desired_ready, d.desired_warm) for p, d in out.items()}


def test_no_budget_changes_nothing() -> None:
    wants = {"a": want(10, 2)}
    assert apportion(wants, {"a": 1}, {"a": 8}, None) == wants


def test_a_budget_that_fits_changes_nothing() -> None:
    wants = {"a": want(4, 1), "b": want(2, 1)}
    assert apportion(wants, {"a": 0, "b": 0}, {"a": 8, "b": 8}, 64) == wants


def test_budget_trims_warm_before_ready() -> None:
    """8 replicas of 1 GPU fit: both pools' 3 + 3 ready come first, then 2 of the 4 warm."""
    out = apportion({"a": want(3, 2), "b": want(3, 2)}, {"a": 1, "b": 1}, {"a": 1, "b": 1}, 8)
    assert sizes(out) == {"a": (3, 1), "b": (3, 1)}
    assert out["a"].held_by == "gpu_budget"
    assert out["a"].chain.budget_trimmed_warm == 1.0
    assert out["a"].chain.raw == 3.0
    assert out["a"].chain.steps()[-2:] == (
        ("budget_trimmed_ready", 0.0),
        ("budget_trimmed_warm", 1.0),
    )


def test_the_largest_relative_shortfall_gets_gpus_first() -> None:
    """Budget 10, both have 2: a wants 4 (short 50%), b wants 12 (short 83%); the 6 spare
    replicas go to b until its shortfall ratio falls to a's, then alternately."""
    out = apportion({"a": want(4), "b": want(12)}, {"a": 2, "b": 2}, {"a": 1, "b": 1}, 10)
    a, b = out["a"].desired_ready, out["b"].desired_ready
    assert a + b == 10
    assert (a, b) == (3, 7)


def test_never_below_what_a_pool_has_or_its_minimum() -> None:
    """The budget is already spent by what exists: nothing is taken away, only scale-ups
    stopped; a pool below its minimum still gets it."""
    out = apportion(
        {"a": want(6, 1), "b": want(3)},
        {"a": 5, "b": 0},
        {"a": 8, "b": 8},
        16,
        min_ready={"b": 1},
    )
    assert sizes(out) == {"a": (5, 0), "b": (1, 0)}


def test_a_pool_whose_replica_does_not_fit_leaves_gpus_to_smaller_ones() -> None:
    """4 GPUs left: a's 8-GPU replica cannot fit, b's 1-GPU replicas can."""
    out = apportion({"a": want(2), "b": want(5)}, {"a": 1, "b": 1}, {"a": 8, "b": 1}, 13)
    assert sizes(out) == {"a": (1, 0), "b": (5, 0)}


def test_a_scale_down_is_passed_through() -> None:
    wants = {"a": Decision(2, 0, "scale_down", False, {})}
    assert apportion(wants, {"a": 6}, {"a": 8}, 8) == wants
