"""`homing workers ls` as a table: each worker's breaker state."""

from __future__ import annotations

from homing.admin.commands import WORKER_HEADERS, _worker_row, message_dict
from homing.v1 import admin_pb2 as pb


def row(phase: str = "ready", **fields: object) -> dict[str, str]:
    """The table row of a `Worker` message, by column header."""
    message = pb.Worker(id="w0", model="m", url="grpc://h:1", phase=phase, **fields)
    return dict(zip(WORKER_HEADERS, _worker_row(message_dict(message)), strict=True))


def test_the_breaker_column_shows_closed_open_and_half_open() -> None:
    assert [row(breaker=b)["BREAKER"] for b in ("closed", "open", "half_open")] == [
        "closed",
        "open",
        "half-open",
    ]


def test_a_server_that_reports_no_breaker_shows_a_dash() -> None:
    assert row()["BREAKER"] == "-"
