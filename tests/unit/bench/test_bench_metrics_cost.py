"""The metrics-on/off and the 2-processes comparisons of bench-gateway and bench-overhead:
target names and the ratio arithmetic, on hand-built figures."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from homing.bench.gateway_overhead import MODES, TENANT_MODES, metrics_cost
from homing.bench.overhead import (
    HOMING,
    HOMING_NOMETRICS,
    HOMING_P2,
    HOMING_SI2,
    HOMING_SI4,
    HOMING_SI8,
    SMG,
    STREAM_INTERVALS,
    summarize,
)
from homing.bench.overhead.cli import _targets


def test_gateway_modes_include_no_metrics_without_the_tenant_key() -> None:
    assert "no_metrics" in MODES
    assert "no_metrics" not in TENANT_MODES


def test_metrics_cost_is_cpu_per_request_on_over_off() -> None:
    cpu_s = {"off": 0.210, "no_metrics": 0.200}  # 1,000 requests each
    on = {"p50_ms": 13.0, "p99_ms": 30.0}
    off = {"p50_ms": 12.5, "p99_ms": 24.0}
    cost = metrics_cost(cpu_s, {"off": 1000, "no_metrics": 1000}, on, off)
    assert cost == {
        "cpu_us_per_request_metrics_on": 210.0,
        "cpu_us_per_request_metrics_off": 200.0,
        "metrics_cpu_ratio": 1.05,
        "metrics_added_cpu_us": 10.0,
        "metrics_ratio_p50": 1.04,
        "metrics_ratio_p99": 1.25,
    }


def test_targets_accepts_homing_nometrics_with_a_dash() -> None:
    assert _targets("homing,homing-nometrics") == frozenset({HOMING, HOMING_NOMETRICS})
    with pytest.raises(argparse.ArgumentTypeError):
        _targets("homing_no_metrics")


def test_summarize_gives_metrics_on_off_as_homing_over_homing_nometrics() -> None:
    rounds = [
        {
            "non_streamed": {
                HOMING: {"gateway_cpu_ms": 2.2},
                HOMING_NOMETRICS: {"gateway_cpu_ms": 2.0},
            }
        },
        {
            "non_streamed": {
                HOMING: {"gateway_cpu_ms": 2.4},
                HOMING_NOMETRICS: {"gateway_cpu_ms": 2.0},
            }
        },
        {
            "non_streamed": {
                HOMING: {"gateway_cpu_ms": 2.1},
                HOMING_NOMETRICS: {"gateway_cpu_ms": 2.0},
            }
        },
    ]
    summary = summarize(rounds, rss={})
    assert summary["medians"]["cpu_ms_non_streamed"][HOMING_NOMETRICS] == 2.0
    assert summary["ratios_metrics_on_off"]["cpu_ms_non_streamed"] == 1.1  # median 2.2 / 2.0
    assert summary["ratios"]["cpu_ms_non_streamed"] is None  # no smg in these rounds
    assert summary["medians"]["cpu_ms_non_streamed"][SMG] is None


def test_summarize_gives_two_processes_over_one_as_homing_p2_over_homing() -> None:
    """The `--processes 2` target's ratio: its CPU (all its processes') over homing's."""
    rounds = [
        {"non_streamed": {HOMING: {"gateway_cpu_ms": 2.0}, HOMING_P2: {"gateway_cpu_ms": c}}}
        for c in (2.1, 2.3, 2.2)
    ]
    summary = summarize(rounds, rss={})
    assert summary["medians"]["cpu_ms_non_streamed"][HOMING_P2] == 2.2
    assert summary["ratios_p2_to_p1"]["cpu_ms_non_streamed"] == 1.1


def test_targets_accepts_homing_p2() -> None:
    assert _targets("homing,homing-p2") == frozenset({HOMING, HOMING_P2})


def test_summarize_gives_each_fixed_interval_over_homing_and_smg_at_one() -> None:
    """A fixed-interval target's CPU per token over homing's and smg's (both at interval 1)."""
    key = "cpu_us_per_streamed_token"
    rounds = [
        {key: {HOMING: 50.0, SMG: 20.0, HOMING_SI4: si4, HOMING_SI8: 10.0}}
        for si4 in (12.0, 14.0, 13.0)
    ]
    summary = summarize(rounds, rss={})
    ratios = summary["ratios_intervals_to_si1"]
    assert ratios[HOMING_SI4][key] == {"to_homing": 0.26, "to_smg": 0.65}  # median 13
    assert ratios[HOMING_SI8][key] == {"to_homing": 0.2, "to_smg": 0.5}
    assert ratios[HOMING_SI2][key] == {"to_homing": None, "to_smg": None}  # not measured


def test_targets_accepts_the_fixed_interval_targets() -> None:
    assert _targets("homing-si2,homing_si4") == frozenset({HOMING_SI2, HOMING_SI4})
    assert STREAM_INTERVALS == {HOMING_SI2: 2, HOMING_SI4: 4, HOMING_SI8: 8}


def test_an_older_tree_gets_the_interval_config_only_if_it_knows_the_key(tmp_path: Path) -> None:
    """homing_before runs with `[engines] stream_interval = 1` only when its tree has that
    setting (an older one refuses unknown keys, and streams a token per chunk anyway)."""
    from homing.bench.overhead.stack import _knows_stream_interval

    engines = tmp_path / "homing" / "config" / "engines.py"
    assert not _knows_stream_interval(tmp_path)  # no such file: an even older layout
    engines.parent.mkdir(parents=True)
    engines.write_text("class EngineSettings:\n    health_interval_s = 1.0\n")
    assert not _knows_stream_interval(tmp_path)
    engines.write_text("class EngineSettings:\n    stream_interval = 1\n")
    assert _knows_stream_interval(tmp_path)
