"""`homing serve` that cannot start says why in one non-empty line, "homing: <message>":
exit 2 for a configuration file it cannot read, exit 1 for workers that were never ready or
an autoscaler that could not start its first replicas."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from homing.cli import error_message
from tests.helpers import free_port


def _serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "homing", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _make(config: Path, kind: str) -> str:
    """Make `config` a file `homing serve` cannot read; the reason it gives."""
    if kind == "not utf-8":
        config.write_bytes(b"\xfe[gateway]\n")
        return "not UTF-8 text (byte 0 is invalid)"
    if kind == "fifo":
        os.mkfifo(config)  # no writer: opening it to read would wait for ever
        return "not a regular file (a FIFO)"
    if kind == "/dev/zero":
        config.symlink_to("/dev/zero")  # read to the end, it would never end
        return "not a regular file (a character device)"
    if kind == "nested":
        config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
        return "nested too deeply to read"
    assert kind == "huge"
    with config.open("wb") as f:
        f.truncate(64 * 1024 * 1024)
    return "larger than 4 MiB"


@pytest.mark.parametrize("kind", ["not utf-8", "fifo", "/dev/zero", "nested", "huge"])
def test_a_config_file_it_cannot_read_exits_2_with_the_reason(tmp_path: Path, kind: str) -> None:
    config = tmp_path / "homing.toml"
    reason = _make(config, kind)
    done = _serve(config)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == f"homing: {config}: {reason}"


def _config(tmp_path: Path, sections: str) -> Path:
    """A config file on free ports with its own state dir, and `sections` after those."""
    config = tmp_path / "homing.toml"
    config.write_text(
        f"""
[gateway]
port = {free_port()}
grpc_port = {free_port()}
[admin]
state_dir = "{tmp_path / "state"}"
{sections}"""
    )
    return config


def test_workers_never_ready_exit_1_naming_the_timeout(tmp_path: Path) -> None:
    """The start's TimeoutError (an OSError) has its own message, not an empty one."""
    config = _config(
        tmp_path,
        f"""[engines]
workers = ["grpc://127.0.0.1:{free_port()}"]
startup_timeout_s = 0.5
""",
    )
    done = _serve(config)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "homing: no worker was ready within engines.startup_timeout_s (0.5 s)"
    )


def test_an_autoscaler_that_cannot_start_its_first_replica_exits_1_naming_it(
    tmp_path: Path,
) -> None:
    """The exec actuator's script does not exist: the start's ActuatorError is one line
    that says it came from the autoscaler and which command failed."""
    script = tmp_path / "no-such-script"
    config = _config(
        tmp_path,
        f"""[scaler]
enabled = true
actuator = "exec"
[scaler.exec]
command = ["{script}"]
""",
    )
    done = _serve(config)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"homing: autoscaler: cannot run '{script} scale 1': [Errno 2] No such file or directory"
    )


@pytest.mark.parametrize(
    ("err", "shown"),
    [
        (TimeoutError(), "TimeoutError"),
        (OSError(), "OSError"),
        (RuntimeError("worker w0 exited"), "worker w0 exited"),
    ],
)
def test_an_error_without_a_message_is_shown_by_its_type(err: BaseException, shown: str) -> None:
    assert error_message(err) == shown
