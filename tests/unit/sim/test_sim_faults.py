"""Fault bodies: what `POST /fault` accepts, what it refuses with a message, and the state."""

from __future__ import annotations

import pytest

from homing.sim.faults import Fault, FaultError, FaultState, parse_fault


class TestParseFault:
    @pytest.mark.parametrize(
        ("body", "fault"),
        [
            ({}, Fault(reset=True)),
            ({"slowdown": 3}, Fault(slowdown=3.0)),
            ({"stall_s": 10}, Fault(stall_s=10.0)),
            ({"health": False}, Fault(health=False)),
            ({"reject": "UNAVAILABLE"}, Fault(reject="UNAVAILABLE")),
            ({"reject": "RESOURCE_EXHAUSTED"}, Fault(reject="RESOURCE_EXHAUSTED")),
            ({"reject": None}, Fault(clear_reject=True)),
            ({"crash": True}, Fault(crash=True)),
            ({"restart": True}, Fault(restart=True)),
            ({"clear": True}, Fault(clear=True)),
            ({"slowdown": 2.5, "health": False}, Fault(slowdown=2.5, health=False)),
            ({"report_kv_usage": 0.99}, Fault(report_kv_usage=0.99)),
            ({"report_kv_usage": 0}, Fault(report_kv_usage=0.0)),
            ({"report_kv_usage": 1}, Fault(report_kv_usage=1.0)),
            ({"report_kv_usage": None}, Fault(clear_report_kv_usage=True)),
            (
                {"report_kv_usage": 0.5, "slowdown": 2},
                Fault(slowdown=2.0, report_kv_usage=0.5),
            ),
        ],
    )
    def test_each_documented_body_parses(self, body: dict[str, object], fault: Fault) -> None:
        """Every body the issue lists becomes the matching Fault."""
        assert parse_fault(body) == fault

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ([1, 2], "JSON object"),
            ({"slow": 2}, "unknown fault key"),
            ({"slowdown": 0}, "'slowdown' must be a finite number > 0"),
            ({"slowdown": "fast"}, "'slowdown'"),
            ({"slowdown": True}, "'slowdown'"),
            ({"stall_s": -1}, "'stall_s'"),
            ({"slowdown": 10**400}, "'slowdown' must be a finite number > 0"),
            ({"stall_s": 10**400}, "'stall_s'"),
            ({"health": "no"}, "'health' must be true or false"),
            ({"reject": "INTERNAL"}, "'reject' must be one of"),
            ({"crash": False}, "'crash' must be true"),
            ({"crash": True, "slowdown": 2}, "only key"),
            ({"report_kv_usage": 1.5}, "'report_kv_usage' must be a number in \\[0, 1\\]"),
            ({"report_kv_usage": -0.1}, "'report_kv_usage'"),
            ({"report_kv_usage": "full"}, "'report_kv_usage'"),
            ({"report_kv_usage": True}, "'report_kv_usage'"),
            ({"report_kv_usage": float("nan")}, "'report_kv_usage'"),
            ({"report_kv_usage": 10**400}, "'report_kv_usage'"),
            ({"restart": True, "report_kv_usage": 0.9}, "only key"),
        ],
    )
    def test_bad_bodies_are_refused_with_a_message_naming_the_problem(
        self, body: object, message: str
    ) -> None:
        """A malformed fault raises FaultError whose message says what is wrong."""
        with pytest.raises(FaultError, match=message):
            parse_fault(body)


class TestFaultState:
    def test_faults_combine_and_an_empty_body_resets_them(self) -> None:
        """Slowdown, stall, health and reject are held until `{}` clears them all."""
        state = FaultState()
        state.apply(parse_fault({"slowdown": 2, "stall_s": 5}), now=100.0)
        state.apply(parse_fault({"health": False, "reject": "UNAVAILABLE"}), now=101.0)
        state.apply(parse_fault({"report_kv_usage": 0.99}), now=101.0)
        assert state.stalled(104.9) and not state.stalled(105.0)
        assert state.as_dict(101.0) == {
            "slowdown": 2.0,
            "stall_s": 4.0,
            "health": False,
            "reject": "UNAVAILABLE",
            "report_kv_usage": 0.99,
        }
        assert state.kv_usage(0.1) == 0.99
        state.apply(parse_fault({}), now=102.0)
        assert state == FaultState()
        assert state.kv_usage(0.1) == 0.1

    def test_report_kv_usage_null_reports_the_real_figure_again(self) -> None:
        """`{"report_kv_usage": null}` lifts only that fault."""
        state = FaultState()
        state.apply(parse_fault({"report_kv_usage": 0.99, "slowdown": 3}), now=0.0)
        state.apply(parse_fault({"report_kv_usage": None}), now=1.0)
        assert (state.report_kv_usage, state.slowdown) == (None, 3.0)
        assert state.kv_usage(0.25) == 0.25
