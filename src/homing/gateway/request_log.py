"""The request log: one `request_done` line per request, and request ids.

Rule of the file: every request writes exactly one `request_done` line (structlog, logger
`homing.request`): a `Generation` writes its own; a request refused or abandoned before it
reached one writes it through `log_rejection` or `log_cancelled`.
"""

from __future__ import annotations

import uuid

import structlog

from homing.gateway.errors import APIError

log = structlog.get_logger("homing.request")


def log_rejection(request_id: str, err: APIError, **fields: object) -> None:
    """The one log line of a request refused before it reached a worker."""
    log.info(
        "request_done",
        request_id=request_id,
        outcome=f"error_{err.status}",
        error_code=err.code,
        **fields,
    )


def log_cancelled(request_id: str, **fields: object) -> None:
    """The one log line of a request whose client went away before it reached a worker."""
    log.info("request_done", request_id=request_id, outcome="client_closed", **fields)


def new_request_id(supplied: str | None = None) -> str:
    """The client's `x-request-id` when it is sane (<= 128 printable ASCII characters, no
    space: it goes into headers, gRPC metadata and log lines), else a new one."""
    if (
        supplied
        and len(supplied) <= 128
        and supplied.isascii()
        and supplied.isprintable()
        and " " not in supplied
    ):
        return supplied
    return uuid.uuid4().hex
