"""Fixtures shared by unit and integration suites.

Admin sockets: every `App` and every `homing serve` binds the admin API's Unix socket, by
default `$HOMING_STATE_DIR/admin.sock`, and refuses to start while another live server
answers on it. So that tests never meet one another's sockets (nor the user's own
gateway's):
- the session runs with `HOMING_STATE_DIR` set to a fresh directory (set when this file is
  imported, so every fixture and every child process sees it; removed at the end);
- each test gets a directory of its own below it (`_state_dir_per_test`), which the
  `homing serve` processes a test starts inherit;
- each `App` a test builds in this process comes from `helpers.own_app`, which gives it a
  state directory of its own (`App(state_dir=...)`), so module-scoped Apps and several
  Apps at once in one test never share a socket. A config that names `admin.state_dir`
  keeps it (the admin tests use that to share one on purpose).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from redis_server import RedisServer

# Short: a Unix socket path has at most 107 bytes.
SESSION_STATE_DIR = tempfile.mkdtemp(prefix="homing-test-")
os.environ["HOMING_STATE_DIR"] = SESSION_STATE_DIR


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(SESSION_STATE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _state_dir_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """`HOMING_STATE_DIR` is a fresh directory for each test (inherited by its children)."""
    monkeypatch.setenv("HOMING_STATE_DIR", tempfile.mkdtemp(prefix="t-", dir=SESSION_STATE_DIR))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port for the whole session."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()
