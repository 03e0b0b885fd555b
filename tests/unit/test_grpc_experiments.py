"""homing's default for gRPC core's experiments (`homing.GRPC_EXPERIMENTS_DEFAULT`): set on
import unless the environment names its own, and known to the installed grpc."""

from __future__ import annotations

import os
import subprocess
import sys

from homing import GRPC_EXPERIMENTS_DEFAULT, GRPC_EXPERIMENTS_ENV

PRINT_ENV = f"import homing, os; print(repr(os.environ.get({GRPC_EXPERIMENTS_ENV!r})))"


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_ENV}
    base["GRPC_VERBOSITY"] = "ERROR"  # gRPC names an unknown experiment at this level
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_a_homing_process_turns_the_event_engine_client_off_unless_told_otherwise() -> None:
    assert _run(PRINT_ENV).stdout.strip() == repr(GRPC_EXPERIMENTS_DEFAULT)


def test_an_operators_own_experiments_are_kept_even_when_empty() -> None:
    assert _run(PRINT_ENV, GRPC_EXPERIMENTS="-event_engine_dns").stdout.strip() == repr(
        "-event_engine_dns"
    )
    assert _run(PRINT_ENV, GRPC_EXPERIMENTS="").stdout.strip() == repr("")


def test_the_installed_grpc_knows_every_experiment_of_the_default() -> None:
    """gRPC core reads the variable when a channel is first made and names each experiment
    it does not know on stderr ("Unknown experiment: ..."), then ignores it."""
    code = (
        "import asyncio, homing, grpc\n"
        "async def main():\n"
        "    channel = grpc.aio.insecure_channel('127.0.0.1:9')\n"
        "    await channel.close()\n"
        "asyncio.run(main())\n"
    )
    assert "Unknown experiment" not in _run(code).stderr
    # the check can fail: a name grpc does not know is reported
    assert "Unknown experiment: no_such" in _run(code, GRPC_EXPERIMENTS="-no_such").stderr


CHILD_ENV = (
    "import homing.lifeline as l; "
    f"print(repr(l.child_environ().get({GRPC_EXPERIMENTS_ENV!r}, 'unset')))"
)


def test_an_engine_homing_starts_gets_grpc_experiments_as_homing_found_them() -> None:
    """homing's default is for its own processes: a worker it launches (`child_environ`)
    keeps gRPC's defaults, or the operator's value."""
    assert _run(CHILD_ENV).stdout.strip() == repr("unset")
    assert _run(CHILD_ENV, GRPC_EXPERIMENTS="-event_engine_dns").stdout.strip() == repr(
        "-event_engine_dns"
    )
