"""The Prometheus rules and config in deploy/prometheus/ pass promtool: the rule file loads, its
unit tests (homing-rules.test.yml) pass, and a wrong expected value makes them fail.

promtool comes with Debian's `prometheus` package (`make test` installs it). Without it these
tests skip, or fail when HOMING_REQUIRE_PROMETHEUS=1 (as `make test` sets).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "prometheus"
RULES = DEPLOY / "homing-rules.yml"
RULE_TESTS = DEPLOY / "homing-rules.test.yml"
CONFIG = DEPLOY / "prometheus.yml"


def promtool() -> str:
    """Path of `promtool`; skips the test without it (fails under HOMING_REQUIRE_PROMETHEUS=1)."""
    path = shutil.which("promtool")
    if path is not None:
        return path
    reason = (
        "promtool is not installed: run `make test` (it installs Debian's prometheus package) "
        "or `apt-get install prometheus`"
    )
    if os.environ.get("HOMING_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(f"HOMING_REQUIRE_PROMETHEUS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def run_promtool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS` in `cwd`; stdout and stderr together in `.stdout`."""
    return subprocess.run(
        [promtool(), *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=100,
        check=False,
    )


def rule_count() -> int:
    """Recording and alerting rules in homing-rules.yml (`- record:` and `- alert:` entries)."""
    return len(re.findall(r"^\s*- (?:record|alert):", RULES.read_text(), re.MULTILINE))


def test_promtool_loads_every_rule_of_the_rule_file() -> None:
    result = run_promtool("check", "rules", RULES.relative_to(ROOT))
    assert result.returncode == 0, result.stdout
    assert f"SUCCESS: {rule_count()} rules found" in result.stdout, result.stdout


def test_the_rule_unit_tests_pass() -> None:
    result = run_promtool("test", "rules", RULE_TESTS.relative_to(ROOT))
    assert result.returncode == 0, result.stdout
    assert "SUCCESS" in result.stdout, result.stdout
    assert "FAILED" not in result.stdout, result.stdout


def test_the_example_config_is_valid_and_loads_the_rule_file() -> None:
    result = run_promtool("check", "config", CONFIG.relative_to(ROOT))
    assert result.returncode == 0, result.stdout
    assert "SUCCESS: 1 rule files found" in result.stdout, result.stdout
    assert "is valid prometheus config file syntax" in result.stdout, result.stdout
    assert f"SUCCESS: {rule_count()} rules found" in result.stdout, result.stdout


def test_the_rule_unit_tests_fail_when_an_expected_value_is_wrong(tmp_path: Path) -> None:
    promtool()
    # The unit tests expect chat's p95 TTFT to be 1.5 s; expect 1.6 s instead.
    expected = (
        "          - labels: 'homing:request_ttft_seconds:p95_rate5m{model=\"chat\"}'\n"
        "            value: 1.5\n"
    )
    text = RULE_TESTS.read_text()
    assert text.count(expected) == 1
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / RULE_TESTS.name).write_text(text.replace(expected, expected.replace("1.5", "1.6")))

    result = run_promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)

    assert result.returncode != 0, result.stdout
    assert "FAILED" in result.stdout, result.stdout
    failure = result.stdout[result.stdout.index("FAILED") :]
    assert "homing:request_ttft_seconds:p95_rate5m" in failure, result.stdout
    assert re.search(r"exp: .*1\.6E\+00", failure), result.stdout
    assert re.search(r"got: .*1\.5E\+00", failure), result.stdout
