"""What a client sees for each way a worker can fail a request."""

from __future__ import annotations

import grpc
import pytest

from homing.engines.client import EngineError
from homing.gateway.generation import _as_api_error


@pytest.mark.parametrize(
    ("code", "status", "error_code", "param"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, "invalid_value", None),
        (grpc.StatusCode.FAILED_PRECONDITION, 400, "constraint_failed", "response_format"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, None, None),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "timeout", None),
        (grpc.StatusCode.ABORTED, 503, "no_capacity", None),
        (grpc.StatusCode.UNAVAILABLE, 503, "no_capacity", None),
        (grpc.StatusCode.CANCELLED, 503, "no_capacity", None),
        (grpc.StatusCode.INTERNAL, 503, "no_capacity", None),
    ],
)
def test_worker_status_maps_to_a_client_status(
    code: grpc.StatusCode, status: int, error_code: str | None, param: str | None
) -> None:
    """A worker's gRPC status becomes the HTTP status, code and param the client reads; the
    client's own mistakes (a bad input, an output its grammar cannot follow) are 4xx."""
    error = _as_api_error(EngineError(code, "detail"))
    assert (error.status, error.code, error.param) == (status, error_code, param)
    assert "detail" in error.message or code in (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    )
