"""Fixtures shared by unit and integration suites."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port for the whole session."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()
