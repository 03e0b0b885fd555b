"""`homing rollout` and `homing versions`: the argument types (durations, steps,
VERSION=WEIGHT) with their refusals, the status print-out, and the parser as `homing` runs
it."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from homing.admin.commands import Output, message_dict
from homing.admin.rollout_commands import _span, duration, print_status, steps, weight_pair
from homing.cli import admin_parser, main
from homing.v1 import admin_pb2 as pb

# -- duration --


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("2.5", 2.5),
        ("0", 0.0),
        (".5m", 30.0),
        ("1.5h", 5400.0),
        (" 10m ", 600.0),
        ("24h", 86_400.0),
        ("86400", 86_400.0),
    ],
)
def test_duration_reads_seconds_minutes_hours_and_bare_seconds(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["abc", "-1", "10x", "", "nan", "1e3", "10 m s", "h"])
def test_duration_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        duration(text)
    assert str(err.value) == f"{text!r} is not a duration (e.g. 90s, 10m, 1h)"


@pytest.mark.parametrize("text", ["169h", "604801", "10081m", "604800.5s"])
def test_duration_refuses_longer_than_a_week(text: str) -> None:
    """A bake is at most a week, as `[rollout] bake_s` allows."""
    with pytest.raises(argparse.ArgumentTypeError) as err:
        duration(text)
    assert str(err.value) == f"{text!r} is longer than 604800 s"


def test_duration_shows_at_most_40_characters_of_a_bad_value() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        duration("x" * 500)
    assert str(err.value) == f"{'x' * 40!r} is not a duration (e.g. 90s, 10m, 1h)"


# -- steps --


def test_steps_reads_increasing_percents_ending_at_100() -> None:
    assert steps("5,25,50,100") == [5.0, 25.0, 50.0, 100.0]
    assert steps("50,100") == [50.0, 100.0]
    assert steps(" 1 , 2.5,100") == [1.0, 2.5, 100.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5,x", "'5,x': steps are numbers, e.g. 5,25,50,100"),
        ("", "'': steps are numbers, e.g. 5,25,50,100"),
        ("5,,100", "'5,,100': steps are numbers, e.g. 5,25,50,100"),
        ("50,25,100", "'50,25,100': the steps must increase (e.g. 5,25,50,100)"),
        ("5,25", "'5,25': the last step must be 100 (it promotes the canary), got 25"),
        ("0,100", "'0,100': each step is a percent in (0, 100], got 0"),
        ("5,nan,100", "'5,nan,100': steps are numbers, e.g. 5,25,50,100"),
        ("５,100", "'５,100': steps are numbers, e.g. 5,25,50,100"),
        ("1_0,100", "'1_0,100': steps are numbers, e.g. 5,25,50,100"),
    ],
)
def test_steps_refusals_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        steps(text)
    assert str(err.value) == message


# -- weight_pair --


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("v2=10", ("v2", 10.0)),
        ("a=b=3", ("a=b", 3.0)),  # the last "=" splits
        ("v1=0", ("v1", 0.0)),
        ("v1=2.5", ("v1", 2.5)),
    ],
)
def test_weight_pair_splits_version_and_weight(text: str, pair: tuple[str, float]) -> None:
    assert weight_pair(text) == pair


@pytest.mark.parametrize("text", ["v2", "=3", "v2=", "v2=x", "v2=nan", "v2=inf", "v2=-inf"])
def test_weight_pair_refuses_what_is_not_version_equals_finite_weight(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        weight_pair(text)
    assert str(err.value) == f"{text!r} must look like VERSION=WEIGHT (e.g. v2=10)"


# -- print_status --


def _output() -> tuple[Output, io.StringIO]:
    out = Output("table")
    buf = io.StringIO()
    out.console = Console(file=buf, width=200)
    return out, buf


def _printed(status: pb.RolloutStatus) -> list[str]:
    out, buf = _output()
    print_status(message_dict(status), out)
    return [line.rstrip() for line in buf.getvalue().splitlines()]


def _running() -> pb.RolloutStatus:
    s = pb.RolloutStatus(
        model="m",
        has_rollout=True,
        baseline="v1",
        canary="v2",
        phase="running",
        steps=[5, 25, 50, 100],
        step=1,
        weight=25,
        bake_s=600,
        baked_s=192,
        verdict="wait",
        verdict_reason="too few canary requests (12 of 50)",
    )
    s.split.add(version="v1", weight=75)
    s.split.add(version="v2", weight=25)
    s.baseline_figures.CopyFrom(
        pb.VersionFigures(
            version="v1",
            requests=900,
            ready_workers=3,
            error_rate=0.001,
            attainment=0.99,
            ttft_per_uncached_token_s=0.00031,
            tpot_p50_s=0.021,
            output_tokens_mean=212.4,
        )
    )
    s.baseline_figures.finish_reasons.add(reason="length", share=0.1)
    s.baseline_figures.finish_reasons.add(reason="stop", share=0.9)
    s.canary_figures.CopyFrom(pb.VersionFigures(version="v2", requests=12, ready_workers=1))
    s.checks.add(name="error_rate", result="wait", detail="needs 50 judged canary requests")
    s.history.add(
        at_unix_s=1_700_000_000, event="started", weight=5, reason="baseline v1, steps 5,25,50,100"
    )
    s.history.add(at_unix_s=1_700_000_600, event="stepped", weight=25, reason="all checks pass")
    return s


def _split_words(line: str) -> list[str]:
    return line.split()


def test_print_status_of_a_running_rollout_shows_head_split_verdict_tables_and_history() -> None:
    lines = _printed(_running())
    assert lines[:3] == [
        "m: rollout of v2 against v1: running, step 2 of 4 (25%), baked 3m12s of 10m00s",
        "split: v1 75, v2 25",
        "verdict: wait: too few canary requests (12 of 50)",
    ]
    assert lines[3] == "this step's requests"
    assert _split_words(lines[4]) == [
        "VERSION",
        "ROLE",
        "READY",
        "REQUESTS",
        "ERRORS",
        "SLO-MET",
        "TTFT/UNCACHED-TOKEN",
        "TPOT-P50",
        "OUT-TOKENS",
        "FINISH",
    ]
    assert _split_words(lines[5]) == (
        "v1 baseline 3 900 0.1% 99.0% 0.31 ms 21 ms 212 stop 90%, length 10%".split()
    )
    # Unset optional figures show as dashes.
    assert _split_words(lines[6]) == "v2 canary 1 12 - - - - - -".split()
    assert _split_words(lines[7]) == ["CHECK", "RESULT", "DETAIL"]
    assert _split_words(lines[8]) == "error_rate wait needs 50 judged canary requests".split()
    assert lines[9] == "history (UTC)"
    assert _split_words(lines[10]) == ["AT", "EVENT", "WEIGHT", "REASON"]
    assert _split_words(lines[11]) == (
        "2023-11-14 22:13:20 started 5% baseline v1, steps 5,25,50,100".split()
    )
    assert _split_words(lines[12]) == "2023-11-14 22:23:20 stepped 25% all checks pass".split()
    assert len(lines) == 13


def test_print_status_of_an_ended_rollout_shows_the_canary_weight_and_reason() -> None:
    s = _running()
    s.phase = "rolled_back"
    s.weight = 0
    s.reason = "error_rate: 5.0% against 0.1%"
    s.verdict = ""
    del s.checks[:]
    s.history.add(at_unix_s=1_700_000_700, event="rolled_back", weight=0, reason=s.reason)
    lines = _printed(s)
    assert lines[:3] == [
        "m: rollout of v2 against v1: rolled back (canary at 0%)",
        "reason: error_rate: 5.0% against 0.1%",
        "split: v1 75, v2 25",
    ]
    assert not any(line.startswith("verdict:") for line in lines)
    assert not any(line.startswith("CHECK") for line in lines)
    assert _split_words(lines[-1]) == (
        "2023-11-14 22:25:00 rolled back 0% error_rate: 5.0% against 0.1%".split()
    )


def test_print_status_of_a_paused_rollout_names_the_step_and_why() -> None:
    s = _running()
    s.phase = "paused"
    s.baked_s = 0
    s.bake_s = 7200
    s.reason = "paused by operator"
    lines = _printed(s)
    assert lines[:2] == [
        "m: rollout of v2 against v1: paused at step 2 of 4 (25%)",
        "reason: paused by operator",
    ]


def test_print_status_names_an_unlabelled_version() -> None:
    s = _running()
    del s.split[:]
    s.split.add(version="", weight=100)
    s.baseline_figures.version = ""  # the figures fall back to the status's baseline
    lines = _printed(s)
    assert lines[1] == "split: (unlabelled) 100"
    assert _split_words(lines[5])[:2] == ["v1", "baseline"]


def test_print_status_without_a_rollout_shows_only_the_split() -> None:
    assert _printed(pb.RolloutStatus(model="m")) == [
        "m: no rollout",
        "split: none (every ready worker serves, whatever its version)",
    ]
    s = pb.RolloutStatus(model="m")
    s.split.add(version="v1", weight=90)
    s.split.add(version="v2", weight=10)
    assert _printed(s) == ["m: no rollout", "split: v1 90, v2 10"]


# -- the parser, as `homing` runs it --


def test_rollout_start_parses_steps_and_bake() -> None:
    args = admin_parser().parse_args(
        ["rollout", "start", "M", "v2", "--steps", "5,25,100", "--bake", "10m"]
    )
    assert (args.model, args.version, args.steps, args.bake) == ("M", "v2", [5.0, 25.0, 100.0], 600)
    args = admin_parser().parse_args(["rollout", "start", "M", "v2"])
    assert (args.steps, args.bake) == (None, None)  # the server's defaults


def test_versions_set_parses_pairs() -> None:
    args = admin_parser().parse_args(["versions", "set", "M", "v1=90", "v2=10"])
    assert args.weights == [("v1", 90.0), ("v2", 10.0)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["rollout", "start", "M", "v2", "--steps", "5,25"],
            "argument --steps: '5,25': the last step must be 100 (it promotes the canary), got 25",
        ),
        (
            ["rollout", "start", "M", "v2", "--bake", "10x"],
            "argument --bake: '10x' is not a duration (e.g. 90s, 10m, 1h)",
        ),
        (
            ["versions", "set", "M", "v2"],
            "argument VERSION=WEIGHT: 'v2' must look like VERSION=WEIGHT (e.g. v2=10)",
        ),
    ],
)
def test_a_bad_argument_exits_2_with_its_message_on_stderr(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err
    assert err.rstrip().splitlines()[-1].endswith(message)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45.9, "45s"), (192, "3m12s"), (7200, "2h00m"), (3900, "1h05m")],
)
def test_bake_spans_read_in_hours_minutes_and_seconds(seconds: float, text: str) -> None:
    assert _span(seconds) == text


@pytest.mark.parametrize("verb", [[], ["promote"], ["rollback"], ["start"]])
def test_rollout_help_prints(verb: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`homing rollout [VERB] --help` exits 0 (a bare % in a help text would crash it)."""
    with pytest.raises(SystemExit) as exit_:
        main(["rollout", *verb, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage: homing rollout" in out
    if verb == ["promote"]:
        assert "give the canary 100% now" in out and "%%" not in out


def test_weights_in_other_digits_are_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        weight_pair("v1=１００")
