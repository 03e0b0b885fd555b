"""Run names of `homing.bench.routers`: a policy, "POLICY@CONFIG.toml", "smg", "smg_POLICY"."""

from __future__ import annotations

from pathlib import Path

from homing.bench.routers import homing_run, is_smg, run_label, run_slug, smg_policy


def test_a_plain_policy_run_has_no_config_file() -> None:
    assert homing_run("cache_aware") == ("cache_aware", None)
    assert run_slug("cache_aware") == "cache_aware"
    assert run_label("cache_aware") == "homing cache_aware"


def test_a_policy_at_a_config_file_runs_that_policy_with_that_file() -> None:
    name = "cache_aware@bench-out/variants/a6.toml"
    assert homing_run(name) == ("cache_aware", Path("bench-out/variants/a6.toml"))
    assert run_slug(name) == "cache_aware@a6"  # a file-name stem: no directory in it
    assert run_label(name) == "homing cache_aware@a6"
    assert not is_smg(name)


def test_smg_runs_name_smg_policies() -> None:
    assert is_smg("smg") and smg_policy("smg") == "cache_aware"
    assert is_smg("smg_round_robin") and smg_policy("smg_round_robin") == "round_robin"
    assert run_label("smg_round_robin") == "smg round_robin"
