"""LISTEN_* variables: read for this process only, removed for the children, and refused
with the reason when malformed (the real hand-over runs under systemd-socket-activate in
tests/e2e/test_systemd.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from homing.daemon.activation import ActivationError, check_names, listen_sockets


def test_variables_meant_for_another_process_give_no_sockets_and_are_removed() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "http", "PATH": "/bin"}
    assert listen_sockets(env, pid=42) == {}
    assert env == {"PATH": "/bin"}


def test_no_variables_give_no_sockets() -> None:
    assert listen_sockets({}, pid=42) == {}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LISTEN_FDS": "two"}, "LISTEN_FDS='two' is not a count"),
        ({"LISTEN_FDS": "١"}, "LISTEN_FDS='١' is not a count"),
        ({"LISTEN_FDS": "²"}, "LISTEN_FDS='²' is not a count"),
        ({"LISTEN_FDS": "-1"}, "LISTEN_FDS='-1' is not a count"),
        ({"LISTEN_FDS": "9" * 5000}, f"LISTEN_FDS={'9' * 64!r} is not a count"),
        ({"LISTEN_FDS": "65"}, "LISTEN_FDS=65 is more than 64 sockets"),
        ({"LISTEN_FDS": "1000000000"}, "LISTEN_FDS=1000000000 is more than 64 sockets"),
        (
            {"LISTEN_FDS": "2", "LISTEN_FDNAMES": "http"},
            "LISTEN_FDNAMES names 1 sockets, LISTEN_FDS 2",
        ),
    ],
)
def test_malformed_variables_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ActivationError) as err:
        listen_sockets({"LISTEN_PID": "42", **env}, pid=42)
    assert str(err.value) == message


def test_a_listen_pid_that_is_not_ascii_decimal_is_refused() -> None:
    """ "٤٢" is 42 to `int()`, not to sd_listen_fds(3)."""
    with pytest.raises(ActivationError) as err:
        listen_sockets({"LISTEN_PID": "٤٢", "LISTEN_FDS": "1"}, pid=42)
    assert str(err.value) == "LISTEN_PID='٤٢' is not a process id"


def test_a_zero_count_gives_no_sockets() -> None:
    assert listen_sockets({"LISTEN_PID": "42", "LISTEN_FDS": "0"}, pid=42) == {}


#: Run in a child so that descriptor 3 is ours to set: makes KIND's socket (or file) fd 3,
#: then prints what `listen_sockets` gives for it, or its error.
HAND_OVER = """
import os, socket, sys
from homing.daemon.activation import ActivationError, listen_sockets
kind, where = sys.argv[1], sys.argv[2]
if kind == "unix":
    made = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    made.bind(where)
    made.listen()
elif kind == "udp":
    made = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    made.bind(("127.0.0.1", 0))
elif kind == "tcp-unlistened":
    made = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    made.bind(("127.0.0.1", 0))
elif kind == "tcp":
    made = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    made.bind(("127.0.0.1", 0))
    made.listen()
elif kind == "file":
    made = open(where, "w")
if kind == "closed":
    os.close(3) if os.path.exists("/proc/self/fd/3") else None
else:
    os.dup2(made.fileno(), 3)
env = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "http"}
try:
    found = listen_sockets(env)
except ActivationError as err:
    print("error:", err)
else:
    print("ok:", {k: (s.family.name, s.getsockname()[0]) for k, s in found.items()})
"""


def _hand_over(kind: str, where: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", HAND_OVER, kind, str(where)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [
        (
            "unix",
            "error: descriptor 3 (http) is an AF_UNIX socket; homing takes over only TCP "
            "sockets (AF_INET or AF_INET6, ListenStream=HOST:PORT)",
        ),
        ("udp", "error: descriptor 3 (http) is not a listening TCP stream socket"),
        ("tcp-unlistened", "error: descriptor 3 (http) is not a listening TCP stream socket"),
        ("file", "error: descriptor 3 (http) is not a socket: Socket operation on non-socket"),
        ("closed", "error: descriptor 3 (http) is not a socket: Bad file descriptor"),
        ("tcp", "ok: {'http': ('AF_INET', '127.0.0.1')}"),
    ],
)
def test_only_a_listening_tcp_socket_is_taken_over(kind: str, outcome: str, tmp_path: Path) -> None:
    """A Unix socket (`ListenStream=/path`) would leave the HTTP listener without a port:
    refused up front, naming the descriptor and its family; so is anything but a listening
    TCP socket."""
    assert _hand_over(kind, tmp_path / "x") == outcome


def test_a_socket_homing_has_no_listener_for_is_named() -> None:
    with pytest.raises(ActivationError) as err:
        check_names({"grpc": None, "http": None}, {"http"})  # type: ignore[dict-item]
    assert str(err.value) == (
        "socket activation passed grpc; homing listens on http (FileDescriptorName=)"
    )
