"""A real `redis-server` for the quota tests, on a free loopback port, with no persistence.

`make test` installs Debian's `redis-server` when it is missing; a run without the binary
fails with that hint instead of skipping.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One `redis-server --port P --save '' --appendonly no` child process."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:PORT/0`."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it answers PING; fails the test otherwise."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(
                "redis-server is not installed: run `make test` (it installs Debian's "
                "redis-server package) or `apt-get install redis-server`",
                pytrace=False,
            )
        self.process = subprocess.Popen(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"redis-server exited with code {self.process.returncode}")
            if self.ping():
                return
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"redis-server did not answer on port {self.port} within {timeout_s} s")

    def ping(self) -> bool:
        """Whether the server answers `PING` with `+PONG`."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Terminate the server and wait for it (SIGKILL after 5 s)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
