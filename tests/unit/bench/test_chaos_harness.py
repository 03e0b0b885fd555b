"""The chaos harness's command line and table, without starting any process."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from homing.bench.chaos.harness import TABLE_COLUMNS, _scenarios, build_parser, main, table_rows
from homing.bench.chaos.scenarios import SCENARIOS


def test_defaults_are_the_full_suite() -> None:
    """All scenarios, 3 workers, 8 clients, 30 s each, real-time workers, 30 s deadline."""
    args = build_parser().parse_args([])
    assert args.scenarios == list(SCENARIOS)
    assert (args.workers, args.concurrency, args.duration_s) == (3, 8, 30.0)
    assert (args.speedup, args.deadline_s, args.max_tokens, args.json) == (1.0, 30.0, 32, None)


def test_scenarios_are_a_comma_list_or_all() -> None:
    """Known names in the order given; "all"; anything else is refused."""
    assert _scenarios("mixed, kill") == ["mixed", "kill"]
    assert _scenarios("all") == list(SCENARIOS)
    with pytest.raises(argparse.ArgumentTypeError, match="meteor"):
        _scenarios("kill,meteor")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--duration-s", "0"], "--duration-s must be a finite number > 0"),
        (["--speedup", "inf"], "--speedup must be a finite number > 0"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--workers", "17"], "--workers must be 1 to 16"),
        (["--gateway-config", "/nonexistent.toml"], "no such file"),
    ],
)
def test_bad_arguments_exit_2_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad value is named on stderr, with exit status 2."""
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _scenario(**overrides: Any) -> dict[str, Any]:
    fault = {"kind": "kill", "worker": "w0", "start_s": 1.0, "end_s": 4.0}
    fault |= {"stopped_after_s": 0.25, "stopped": True, "back_after_s": 2.0}
    base: dict[str, Any] = {
        "name": "kill", "plan": ["kill w0"], "sent": 10, "completed": 8,
        "failed_before_first_byte": 1, "failed_before_first_byte_with_healthy_other": 1,
        "failed_mid_stream": 1, "cut": 0, "hung": 0, "retried": 3,
        "retry_outcomes": {"retried": 3, "max_retries": 1}, "migrated": None,
        "migration_outcomes": None, "faults": [fault],
        "checks": {"no_hung": True, "no_failure_before_first_byte_with_healthy_other": False},
    }  # fmt: skip
    return base | overrides


def test_table_rows_show_counts_times_and_failed_checks() -> None:
    """One row per scenario, cells in TABLE_COLUMNS order; refused retries and absent
    counters are said so."""
    (row,) = table_rows({"scenarios": [_scenario()]})
    assert len(row) == len(TABLE_COLUMNS)
    assert row == [
        "kill", "kill w0", "10", "8", "1 (1)", "1", "0", "0", "3 (+1 refused)", "n/a",
        "0.2", "2.0", "FAIL: no_failure_before_first_byte_with_healthy_other",
    ]  # fmt: skip


def test_table_rows_say_never_and_not_applicable() -> None:
    """A worker that kept serving is "never" stopped, one that never came back "never"
    back; a worker with no traffic before its fault gets "-"."""
    kept = {"stopped_after_s": 2.9, "stopped": False, "back_after_s": None, "end_s": 4.0}
    idle = {"stopped_after_s": None, "stopped": None, "back_after_s": None, "end_s": 4.0}
    scenario = _scenario(faults=[kept, idle], checks={"no_hung": True})
    (row,) = table_rows({"scenarios": [scenario]})
    assert row[-3:] == ["never / -", "never / -", "ok"]
