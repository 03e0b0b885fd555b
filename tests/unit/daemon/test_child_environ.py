"""The processes homing starts (simulated workers, SGLang servers) get none of the variables
systemd sets for the service alone: with NOTIFY_SOCKET a child would tell systemd it is
ready or stopping, with WATCHDOG_* feed the watchdog, with LISTEN_* take the sockets."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from homing.engines.sglang_launch import SglangLaunch, resolve_ports, start_sglang
from homing.lifeline import SERVICE_VARIABLES
from homing.sim.process import spawn_sim, terminate

SERVICE_ENV = {
    "NOTIFY_SOCKET": "/run/systemd/notify",
    "WATCHDOG_USEC": "10000000",
    "WATCHDOG_PID": "1",
    "LISTEN_FDS": "1",
    "LISTEN_PID": "1",
    "LISTEN_FDNAMES": "http",
}


def _environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if item)


async def test_a_simulated_worker_process_gets_no_service_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(SERVICE_ENV) == SERVICE_VARIABLES
    for key, value in SERVICE_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOMING_TEST_MARK", "kept")
    args = ["--workers", "1", "--port", "0", "--parent-pid", str(os.getpid())]
    process, _ = await spawn_sim(args)
    try:
        env = _environ_of(process.pid)
    finally:
        await terminate([process], 2.0)
    assert env["HOMING_TEST_MARK"] == "kept"
    assert sorted(SERVICE_VARIABLES & set(env)) == []


async def test_an_sglang_process_gets_no_service_variables(tmp_path: Path) -> None:
    """A stand-in `sglang.launch_server` writes the environment it got, then exits 1."""
    seen = tmp_path / "env.json"
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(
        f"import json, os, sys\nopen({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
        "sys.exit(1)\n"
    )
    launch = resolve_ports(SglangLaunch(model_path="/m", python=sys.executable))
    environ = {**os.environ, **SERVICE_ENV, "PYTHONPATH": str(tmp_path)}
    with pytest.raises(RuntimeError, match="exited with code 1 before it served"):
        await start_sglang(launch, startup_timeout_s=60, environ=environ)
    env = json.loads(seen.read_text())
    assert env["PYTHONPATH"] == str(tmp_path)
    assert sorted(SERVICE_VARIABLES & set(env)) == []
