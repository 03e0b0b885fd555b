"""The rollout state machine on explicit `now`s: baking, stepping, promotion, rollback,
pause and resume, the phase errors, the history and the stored form."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from homing.config.rules import MAX_STEPS, check_steps
from homing.rollout.plan import HISTORY_KEPT, Event, Rollout, RolloutError

T0 = 1_700_000_000.0
BAKE = 600.0


def _rollout(steps: list[float] | None = None, bake_s: float = BAKE) -> Rollout:
    return Rollout.start("m", "v1", "v2", steps or [5, 25, 50, 100], bake_s, now=T0)


def test_start_is_at_the_first_step_running_from_now() -> None:
    r = _rollout()
    assert (r.step, r.phase, r.weight, r.step_started_at) == (0, "running", 5.0, T0)
    assert r.active
    assert r.weights() == {"v1": 95.0, "v2": 5.0}
    assert r.steps == [5.0, 25.0, 50.0, 100.0]
    assert r.steps_text() == "5,25,50,100"
    assert r.history == [Event(T0, "started", 5.0, "baseline v1, steps 5,25,50,100")]
    assert r.baked_s(T0 + 42) == 42


def test_start_refuses_canary_equal_to_baseline_and_a_bad_bake() -> None:
    with pytest.raises(ValueError) as err:
        Rollout.start("m", "v1", "v1", [100], BAKE, now=T0)
    assert str(err.value) == "the canary 'v1' is the baseline"
    for bad, shown in ((-1.0, "-1.0"), (math.nan, "nan"), (math.inf, "inf"), (1e300, "1e+300")):
        with pytest.raises(ValueError) as err:
            Rollout.start("m", "v1", "v2", [5, 100], bad, now=T0)
        assert str(err.value) == f"bake_s must be in [0, 604800] seconds, got {shown}"
    with pytest.raises(ValueError, match="the steps must increase"):
        Rollout.start("m", "v1", "v2", [50, 25, 100], BAKE, now=T0)


def test_wait_never_moves_the_rollout() -> None:
    r = _rollout()
    for later in (0.0, BAKE, 10 * BAKE):
        assert r.observe(T0 + later, "wait", "too few requests") is False
    assert (r.step, r.phase) == (0, "running")
    assert r.last_verdict == "wait: too few requests"
    assert [e.event for e in r.history] == ["started"]


def test_pass_before_the_bake_is_over_does_not_move() -> None:
    r = _rollout()
    assert r.observe(T0 + BAKE - 0.001, "pass", "all checks pass") is False
    assert r.step == 0
    assert r.last_verdict == "pass: all checks pass"


def test_pass_after_the_bake_moves_one_step_and_restarts_the_bake() -> None:
    r = _rollout()
    assert r.observe(T0 + BAKE, "pass", "all checks pass") is True
    assert (r.step, r.weight, r.phase) == (1, 25.0, "running")
    assert r.step_started_at == T0 + BAKE
    assert r.baked_s(T0 + BAKE) == 0.0
    # The next step bakes again from the move, not from the start.
    assert r.observe(T0 + BAKE + BAKE / 2, "pass", "ok") is False
    assert r.step == 1
    assert r.observe(T0 + 2 * BAKE, "pass", "ok") is True
    assert r.step == 2


def test_a_zero_bake_moves_on_the_first_pass() -> None:
    r = _rollout(bake_s=0.0)
    assert r.observe(T0, "pass", "ok") is True
    assert r.step == 1


def test_passing_the_step_before_100_promotes() -> None:
    r = _rollout()
    now = T0
    for _ in range(2):
        now += BAKE
        r.observe(now, "pass", "ok")
    assert r.step == 2  # 50%
    now += BAKE
    assert r.observe(now, "pass", "all checks pass") is True
    assert (r.phase, r.weight, r.step) == ("promoted", 100.0, 3)
    assert r.reason == "all checks pass"
    assert not r.active
    assert r.weights() == {"v1": 0.0, "v2": 100.0}
    assert r.history[-1] == Event(now, "promoted", 100.0, "all checks pass")


def test_a_plan_of_100_alone_is_refused_as_it_has_no_baseline_to_compare_with() -> None:
    with pytest.raises(ValueError, match="a rollout needs a step below 100"):
        _rollout(steps=[100])


def test_fail_rolls_back_at_once_with_the_verdicts_reason() -> None:
    r = _rollout()
    assert r.observe(T0 + 1, "fail", "error_rate: 5.0% vs 0.1%") is True  # bake not over
    assert (r.phase, r.weight) == ("rolled_back", 0.0)
    assert r.reason == "error_rate: 5.0% vs 0.1%"
    assert r.weights() == {"v1": 100.0, "v2": 0.0}
    assert not r.active
    assert r.history[-1] == Event(T0 + 1, "rolled_back", 0.0, "error_rate: 5.0% vs 0.1%")


def test_fail_rolls_back_while_paused() -> None:
    r = _rollout()
    r.pause(T0 + 1)
    assert r.observe(T0 + 2, "fail", "tpot: 2x the baseline") is True
    assert (r.phase, r.weight, r.reason) == ("rolled_back", 0.0, "tpot: 2x the baseline")


def test_an_ended_rollout_ignores_verdicts_but_records_the_last() -> None:
    r = _rollout()
    r.rollback(T0 + 1)
    assert r.observe(T0 + 2, "pass", "ok") is False
    assert r.observe(T0 + 3, "fail", "bad") is False
    assert (r.phase, r.reason) == ("rolled_back", "rolled back by operator")
    assert r.last_verdict == "fail: bad"
    assert len(r.history) == 2


def test_pause_holds_the_step_and_resume_restarts_the_bake() -> None:
    r = _rollout()
    r.pause(T0 + BAKE / 2)
    assert (r.phase, r.reason, r.weight) == ("paused", "paused by operator", 5.0)
    assert r.active
    assert r.baked_s(T0 + 10 * BAKE) == 0.0
    assert r.observe(T0 + 10 * BAKE, "pass", "ok") is False
    assert r.step == 0
    resumed = T0 + 10 * BAKE
    r.resume(resumed)
    assert (r.phase, r.reason, r.step_started_at) == ("running", "", resumed)
    # Baked before the pause does not count: a full bake from the resume is needed.
    assert r.observe(resumed + BAKE - 1, "pass", "ok") is False
    assert r.observe(resumed + BAKE, "pass", "ok") is True
    assert r.step == 1


def test_promote_by_hand_from_running_or_paused() -> None:
    r = _rollout()
    r.promote(T0 + 5)
    assert (r.phase, r.weight, r.step, r.reason) == ("promoted", 100.0, 3, "promoted by operator")
    p = _rollout()
    p.pause(T0 + 1)
    p.promote(T0 + 2, reason="looks fine")
    assert (p.phase, p.weight, p.reason) == ("promoted", 100.0, "looks fine")


def test_rollback_by_hand_from_running_or_paused() -> None:
    r = _rollout()
    r.observe(T0 + BAKE, "pass", "ok")
    r.rollback(T0 + BAKE + 1)
    assert (r.phase, r.weight, r.reason) == ("rolled_back", 0.0, "rolled back by operator")
    p = _rollout()
    p.pause(T0 + 1)
    p.rollback(T0 + 2, reason="customer complaint")
    assert (p.phase, p.weight, p.reason) == ("rolled_back", 0.0, "customer complaint")


def _in_phase(phase: str) -> Rollout:
    r = _rollout()
    if phase == "paused":
        r.pause(T0 + 1)
    elif phase == "promoted":
        r.promote(T0 + 1)
    elif phase == "rolled_back":
        r.rollback(T0 + 1)
    assert r.phase == phase
    return r


@pytest.mark.parametrize(
    ("phase", "op", "message"),
    [
        ("running", "resume", "the rollout of v2 is running: it cannot resume"),
        ("paused", "pause", "the rollout of v2 is paused: it cannot pause"),
        ("promoted", "pause", "the rollout of v2 is promoted: it cannot pause"),
        ("promoted", "resume", "the rollout of v2 is promoted: it cannot resume"),
        ("promoted", "promote", "the rollout of v2 is promoted: it cannot promote"),
        ("promoted", "rollback", "the rollout of v2 is promoted: it cannot roll back"),
        ("rolled_back", "pause", "the rollout of v2 is rolled back: it cannot pause"),
        ("rolled_back", "resume", "the rollout of v2 is rolled back: it cannot resume"),
        ("rolled_back", "promote", "the rollout of v2 is rolled back: it cannot promote"),
        ("rolled_back", "rollback", "the rollout of v2 is rolled back: it cannot roll back"),
    ],
)
def test_operations_the_phase_forbids_raise_rollout_error_and_change_nothing(
    phase: str, op: str, message: str
) -> None:
    r = _in_phase(phase)
    before = copy.deepcopy(r)
    with pytest.raises(RolloutError) as err:
        getattr(r, op)(T0 + 2)
    assert str(err.value) == message
    assert r == before


def test_weights_sum_to_100_in_every_phase() -> None:
    r = _rollout()
    seen = [r.weights()]
    r.observe(T0 + BAKE, "pass", "ok")
    seen.append(r.weights())
    r.pause(T0 + BAKE + 1)
    seen.append(r.weights())
    r.promote(T0 + BAKE + 2)
    seen.append(r.weights())
    seen.append(_in_phase("rolled_back").weights())
    for w in seen:
        assert set(w) == {"v1", "v2"}
        assert sum(w.values()) == 100.0


def test_history_records_each_change_in_order_with_the_weight_after_it() -> None:
    r = _rollout()
    r.observe(T0 + BAKE, "pass", "step 1 ok")
    r.observe(T0 + BAKE + 1, "wait", "few requests")  # not an event
    r.pause(T0 + BAKE + 2)
    r.resume(T0 + BAKE + 3)
    r.observe(T0 + 2 * BAKE + 3, "pass", "step 2 ok")
    r.rollback(T0 + 2 * BAKE + 4, reason="manual")
    assert r.history == [
        Event(T0, "started", 5.0, "baseline v1, steps 5,25,50,100"),
        Event(T0 + BAKE, "stepped", 25.0, "step 1 ok"),
        Event(T0 + BAKE + 2, "paused", 25.0, "paused by operator"),
        Event(T0 + BAKE + 3, "resumed", 25.0, "resumed by operator"),
        Event(T0 + 2 * BAKE + 3, "stepped", 50.0, "step 2 ok"),
        Event(T0 + 2 * BAKE + 4, "rolled_back", 0.0, "manual"),
    ]


def test_history_keeps_only_the_newest_events() -> None:
    r = _rollout()
    for i in range(HISTORY_KEPT + 10):
        r.pause(T0 + 2 * i + 1)
        r.resume(T0 + 2 * i + 2)
    assert len(r.history) == HISTORY_KEPT
    assert r.history[-1] == Event(
        T0 + 2 * (HISTORY_KEPT + 9) + 2, "resumed", 5.0, "resumed by operator"
    )
    assert [e.at for e in r.history] == sorted(e.at for e in r.history)
    assert all(e.event != "started" for e in r.history)  # the oldest went first


def _through_json(r: Rollout) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(r.to_dict()))
    return data


@pytest.mark.parametrize("phase", ["running", "paused", "promoted", "rolled_back"])
def test_to_dict_and_from_dict_round_trip_through_json(phase: str) -> None:
    r = _in_phase(phase)
    r.observe(T0 + 3, "wait", "few requests")
    back = Rollout.from_dict(_through_json(r))
    assert back == r
    assert back.weights() == r.weights()
    assert back.history[0] == Event(T0, "started", 5.0, "baseline v1, steps 5,25,50,100")


def test_a_restored_rollout_goes_on_where_it_was() -> None:
    r = _rollout()
    r.observe(T0 + BAKE, "pass", "ok")
    back = Rollout.from_dict(_through_json(r))
    assert back.observe(T0 + 2 * BAKE - 1, "pass", "ok") is False  # its bake kept its start
    assert back.observe(T0 + 2 * BAKE, "pass", "ok") is True
    assert back.step == 2


def test_from_dict_defaults_the_optional_fields_and_caps_the_history() -> None:
    data = _through_json(_rollout())
    for key in ("reason", "last_verdict", "history"):
        del data[key]
    back = Rollout.from_dict(data)
    assert (back.reason, back.last_verdict, back.history) == ("", "", [])
    data["history"] = [
        {"at": T0 + i, "event": "paused", "weight": 5.0} for i in range(HISTORY_KEPT + 5)
    ]
    back = Rollout.from_dict(data)
    assert len(back.history) == HISTORY_KEPT
    assert back.history[0].at == T0 + 5
    assert back.history[0].reason == ""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"phase": "baking"}, "unknown phase 'baking'"),
        ({"step": 4}, "step 4 is out of range"),
        ({"step": -1}, "step -1 is out of range"),
        ({"steps": [50, 25, 100]}, "the steps must increase (e.g. 5,25,50,100)"),
        ({"steps": []}, "a rollout needs at least one step (the last is 100)"),
    ],
)
def test_from_dict_refuses_bad_values_with_value_error(
    change: dict[str, Any], message: str
) -> None:
    data = _through_json(_rollout()) | change
    with pytest.raises(ValueError) as err:
        Rollout.from_dict(data)
    assert str(err.value) == message


@pytest.mark.parametrize("key", ["model", "baseline", "canary", "steps", "step", "phase", "bake_s"])
def test_from_dict_refuses_a_missing_key_with_value_error_naming_it(key: str) -> None:
    data = _through_json(_rollout())
    del data[key]
    with pytest.raises(ValueError) as err:
        Rollout.from_dict(data)
    assert str(err.value) == f"not a stored rollout: {key!r}"


@pytest.mark.parametrize(
    "data",
    [
        [],
        None,
        "rollout",
    ],
)
def test_from_dict_refuses_data_that_is_not_a_table(data: Any) -> None:
    with pytest.raises(ValueError, match=r"^not a stored rollout: "):
        Rollout.from_dict(data)


def test_from_dict_refuses_a_malformed_history_event() -> None:
    data = _through_json(_rollout())
    data["history"] = [{"at": T0, "what": "started"}]
    with pytest.raises(ValueError, match=r"^not a stored rollout: "):
        Rollout.from_dict(data)
    data["history"] = ["started"]
    with pytest.raises(ValueError, match=r"^not a stored rollout: "):
        Rollout.from_dict(data)


def test_check_steps_returns_floats() -> None:
    assert check_steps([5, 25, 50, 100]) == [5.0, 25.0, 50.0, 100.0]
    assert check_steps(iter(["1", "100"])) == [1.0, 100.0]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([], "a rollout needs at least one step (the last is 100)"),
        ([5, 50, 25, 100], "the steps must increase (e.g. 5,25,50,100)"),
        ([5, 25, 25, 100], "the steps must increase (e.g. 5,25,50,100)"),
        ([5, 25, 50], "the last step must be 100 (it promotes the canary), got 50"),
        ([0, 50, 100], "each step is a percent in (0, 100], got 0"),
        ([-5, 100], "each step is a percent in (0, 100], got -5"),
        ([5, 150], "each step is a percent in (0, 100], got 150"),
        ([5, math.nan, 100], "each step is a percent in (0, 100], got nan"),
        ([5, math.inf], "each step is a percent in (0, 100], got inf"),
        (
            [i * 100 / (MAX_STEPS + 1) for i in range(1, MAX_STEPS + 2)],
            f"a rollout has at most {MAX_STEPS} steps, got {MAX_STEPS + 1}",
        ),
    ],
)
def test_check_steps_says_what_is_wrong(steps: list[float], message: str) -> None:
    with pytest.raises(ValueError) as err:
        check_steps(steps)
    assert str(err.value) == message


def test_check_steps_allows_exactly_max_steps() -> None:
    steps = [i * 100 / MAX_STEPS for i in range(1, MAX_STEPS + 1)]
    steps[-1] = 100.0
    assert len(check_steps(steps)) == MAX_STEPS


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("step_started_at", float("nan"), "step_started_at must be a finite number, got nan"),
        ("bake_s", float("inf"), "bake_s must be a finite number, got inf"),
        ("bake_s", True, "bake_s must be a finite number, got True"),
        ("canary", "v\n2", "'v\\n2' is not a version label"),
        ("canary", "", "the canary is empty or the baseline"),
        ("baseline", 7, "7 is not a version label"),
    ],
)
def test_from_dict_refuses_values_that_would_stall_or_break_a_rollout(
    field: str, value: object, message: str
) -> None:
    data = _rollout().to_dict()
    data[field] = value
    with pytest.raises(ValueError) as err:
        Rollout.from_dict(data)
    assert str(err.value) == message


def test_from_dict_refuses_a_history_event_that_is_not_numbers_where_numbers_go() -> None:
    data = _rollout().to_dict()
    data["history"][0]["at"] = "yesterday"
    with pytest.raises(ValueError) as err:
        Rollout.from_dict(data)
    assert str(err.value) == "an event's at must be a finite number, got 'yesterday'"


def test_a_stored_plan_of_100_alone_still_reads() -> None:
    """Older plans may have had no step below 100: they are read back, only new ones are
    refused."""
    data = _rollout().to_dict()
    data["steps"], data["step"] = [100.0], 0
    assert Rollout.from_dict(data).steps == [100.0]
