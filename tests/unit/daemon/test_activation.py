"""LISTEN_* variables: read for this process only, removed for the children, and refused
with the reason when malformed (the real hand-over runs under systemd-socket-activate in
tests/e2e/test_systemd.py)."""

from __future__ import annotations

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


def test_a_socket_homing_has_no_listener_for_is_named() -> None:
    with pytest.raises(ActivationError) as err:
        check_names({"grpc": None, "http": None}, {"http"})  # type: ignore[dict-item]
    assert str(err.value) == (
        "socket activation passed grpc; homing listens on http (FileDescriptorName=)"
    )
