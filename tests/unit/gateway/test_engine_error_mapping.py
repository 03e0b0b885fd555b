"""What a client sees for each way a worker can refuse or fail a request."""

from __future__ import annotations

import grpc
import pytest

from homing.engines.client import EngineError
from homing.gateway.errors import MAX_WORKER_MESSAGE, from_engine_error


@pytest.mark.parametrize(
    ("code", "constrained", "status", "error_code", "param"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, False, 400, "invalid_value", None),
        (grpc.StatusCode.FAILED_PRECONDITION, True, 400, "constraint_failed", "response_format"),
        (grpc.StatusCode.FAILED_PRECONDITION, False, 503, "no_capacity", None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False, 429, None, None),
        (grpc.StatusCode.DEADLINE_EXCEEDED, False, 504, "timeout", None),
        (grpc.StatusCode.ABORTED, False, 503, "no_capacity", None),
        (grpc.StatusCode.UNAVAILABLE, False, 503, "no_capacity", None),
        (grpc.StatusCode.CANCELLED, False, 503, "no_capacity", None),
        (grpc.StatusCode.INTERNAL, False, 503, "no_capacity", None),
    ],
)
def test_worker_status_maps_to_a_client_status(
    code: grpc.StatusCode, constrained: bool, status: int, error_code: str | None, param: str | None
) -> None:
    """A worker's gRPC status becomes the HTTP status, code and param the client reads; the
    client's own mistakes (a bad input, an output its grammar cannot follow) are 4xx, and a
    FAILED_PRECONDITION without a grammar is the worker's failure."""
    error = from_engine_error(EngineError(code, "detail"), constrained=constrained)
    assert (error.status, error.code, error.param) == (status, error_code, param)


def test_a_long_worker_message_is_cut() -> None:
    """A worker's message longer than MAX_WORKER_MESSAGE is cut, so a worker quoting a large
    request back does not make the client's error as large."""
    error = from_engine_error(EngineError(grpc.StatusCode.INVALID_ARGUMENT, "x" * 100_000))
    assert len(error.message) < MAX_WORKER_MESSAGE + 100
    assert error.message.endswith("x...")
