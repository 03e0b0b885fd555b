"""The chaos suite, short: every scenario for a few seconds (`python -m homing.bench.chaos`
as a user runs it, over 3 real simulated workers and a real `homing serve`), run once for
this module, and what the gateway promises under those faults, one claim per test: no
request hangs, none fails before its first byte while another healthy worker exists, every
stream that fails after content says so with an error event, every faulty worker serves
again after its fault, and the harness's exit status follows its checks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from homing.bench.chaos.scenarios import SCENARIOS

DURATION_S = 6
"""Seconds per scenario (0.9 before the fault, 2.1 under it, 3 after its end, longer while
the faulty worker has not served again)."""

pytestmark = pytest.mark.timeout(200)  # the first test also runs the suite (~60 s idle)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The harness's JSON result, its exit status (`returncode`) and output (`where`)."""
    tmp = tmp_path_factory.mktemp("chaos")
    out = tmp / "chaos.json"
    argv = [
        sys.executable, "-m", "homing.bench.chaos", "--duration-s", str(DURATION_S),
        "--concurrency", "4", "--max-tokens", "24", "--deadline-s", "20",
        "--log-dir", str(tmp / "logs"), "--json", str(out),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=190)
    where = (
        f"wall {time.monotonic() - started:.1f} s\nstdout:\n{done.stdout}\n"
        f"stderr:\n{done.stderr[-4000:]}\nlogs in {tmp / 'logs'}"
    )
    assert out.is_file(), where
    result = json.loads(out.read_text())
    result["returncode"], result["where"] = done.returncode, where
    return result


def _scenario(chaos: dict[str, Any], name: str) -> tuple[dict[str, Any], str]:
    found = [s for s in chaos["scenarios"] if s["name"] == name]
    assert found, chaos["where"]
    return found[0], f"scenario {name}: {json.dumps(found[0], indent=1)[:3000]}\n{chaos['where']}"


def test_every_scenario_ran_and_the_exit_status_follows_the_checks(chaos: dict[str, Any]) -> None:
    """All scenarios in order, no harness error; exit 0 exactly when every check held."""
    assert chaos["error"] is None and not chaos["interrupted"], chaos["where"]
    assert [s["name"] for s in chaos["scenarios"]] == list(SCENARIOS), chaos["where"]
    assert chaos["returncode"] == (0 if chaos["ok"] else 1), chaos["where"]
    assert chaos["ok"] == all(s["ok"] for s in chaos["scenarios"]), chaos["where"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_no_request_hangs(chaos: dict[str, Any], name: str) -> None:
    """No request passed its 20 s client deadline."""
    s, where = _scenario(chaos, name)
    assert s["hung"] == 0, where


@pytest.mark.parametrize("name", SCENARIOS)
def test_no_request_fails_before_its_first_byte_while_another_worker_is_healthy(
    chaos: dict[str, Any], name: str
) -> None:
    """Every request refused, or ended before any content, had no fault-free worker to go to
    (with 3 workers and at most 2 faulty, that means none is refused)."""
    s, where = _scenario(chaos, name)
    assert s["failed_before_first_byte_with_healthy_other"] == 0, where


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_stream_that_fails_after_content_ends_with_an_error_event(
    chaos: dict[str, Any], name: str
) -> None:
    """No stream was cut after content without an error event (or ended with "abort")."""
    s, where = _scenario(chaos, name)
    assert s["cut"] == 0, where


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_faulty_worker_serves_again_after_its_fault(chaos: dict[str, Any], name: str) -> None:
    """Each fault ended, and its worker served a request started after that."""
    s, where = _scenario(chaos, name)
    assert s["checks"]["recovered"], where
    assert all(f["end_s"] is not None for f in s["faults"]), where


@pytest.mark.parametrize("name", SCENARIOS)
def test_requests_complete_from_a_healthy_start(chaos: dict[str, Any], name: str) -> None:
    """Each scenario began with every worker healthy and completed requests."""
    s, where = _scenario(chaos, name)
    assert s["checks"]["settled"], where
    assert s["completed"] > 0 and s["sent"] >= s["completed"], where
