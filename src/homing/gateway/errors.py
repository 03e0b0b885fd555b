"""OpenAI-shaped errors and their HTTP and gRPC status codes.

Every error a client can cause is an `APIError` with the body OpenAI sends:
`{"error": {"message", "type", "param", "code"}}`. Client mistakes are 4xx and are never
counted against a worker's health; capacity problems are 503 with `Retry-After`.
The gRPC mapping follows SGLang's servicer (docs/architecture.md, "Protocol facts"):
400 INVALID_ARGUMENT, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 408/504 DEADLINE_EXCEEDED,
else INTERNAL; plus the standard 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND,
413 INVALID_ARGUMENT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from homing.engines.client import EngineError

_GRPC_BY_HTTP: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

_TYPE_BY_HTTP: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    414: "invalid_request_error",
    415: "invalid_request_error",
    417: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


@dataclass
class APIError(Exception):
    """An error answered to the client with an OpenAI-shaped body.

    `status` is the HTTP status; `retry_after_s` (seconds) becomes a `Retry-After` header
    on 429/503.
    """

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str | None = None
    retry_after_s: int | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        """The JSON body: `{"error": {"message", "type", "param", "code"}}`."""
        return {
            "error": {
                "message": self.message,
                "type": self.type or _TYPE_BY_HTTP.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    @property
    def grpc_code(self) -> grpc.StatusCode:
        """The gRPC status mapped from `status`."""
        return _GRPC_BY_HTTP.get(self.status, grpc.StatusCode.INTERNAL)


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    """A 400 `invalid_request_error`."""
    return APIError(400, message, param=param, code=code)


def model_not_found(model: str) -> APIError:
    """404 for a model this gateway does not serve (OpenAI's `model_not_found`)."""
    return APIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def internal_error() -> APIError:
    """500 for a fault in the gateway itself (the details go to the log, not the client)."""
    return APIError(
        500, "Internal error in the gateway.", code="internal_error", type="server_error"
    )


def no_capacity(message: str, retry_after_s: int = 1) -> APIError:
    """503 when no healthy replica can take the request."""
    return APIError(
        503,
        message,
        code="no_capacity",
        type="service_unavailable_error",
        retry_after_s=retry_after_s,
    )


def drained(timeout_s: float) -> APIError:
    """503 for a request the gateway cut at shutdown, after the drain timeout."""
    return APIError(
        503,
        f"The gateway is shutting down and this request did not finish within the drain "
        f"timeout ({timeout_s:g} s); retry it.",
        code="drained",
        type="service_unavailable_error",
        retry_after_s=1,
    )


def replica_cut(reason: str) -> APIError:
    """503 for a request whose replica was taken out while it ran: `reason` is
    "worker_drained" (its drain timed out) or "worker_removed" (removed by force)."""
    what = (
        "was drained and the drain timeout passed"
        if reason == "worker_drained"
        else ("was removed")
    )
    return APIError(
        503,
        f"The replica serving this request {what} before it finished; retry it.",
        code=reason,
        type="service_unavailable_error",
        retry_after_s=1,
    )


def shutting_down() -> APIError:
    """503 for a request that arrives while the gateway drains (the connection is closed,
    so the client's retry reaches another instance)."""
    return APIError(
        503,
        "The gateway is shutting down and takes no new requests; retry it.",
        code="shutting_down",
        type="service_unavailable_error",
        retry_after_s=1,
    )


# Characters of a worker's own message an error shows (it may quote the request back, e.g. a
# whole JSON schema).
MAX_WORKER_MESSAGE = 1024


def from_engine_error(err: EngineError, *, constrained: bool = False) -> APIError:
    """The client's error for a worker's refusal or failure (SGLang's servicer mapping, read
    backwards); `constrained`: the request carried a grammar, so FAILED_PRECONDITION (the
    output could not follow it) is the client's 400, not a worker failure."""
    code = err.code
    detail = err.message
    if len(detail) > MAX_WORKER_MESSAGE:
        detail = detail[:MAX_WORKER_MESSAGE] + "..."
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return invalid(f"The worker rejected the request: {detail}")
    if code == grpc.StatusCode.FAILED_PRECONDITION and constrained:
        return invalid(
            f"The output could not follow the request's constraint: {detail}",
            "response_format",
            "constraint_failed",
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return APIError(429, f"The worker is out of capacity: {detail}", retry_after_s=1)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(
            504, "The request did not finish within the gateway's time limit.", code="timeout"
        )
    if code == grpc.StatusCode.ABORTED:
        return no_capacity("The worker aborted the request; retry it.")
    return no_capacity(f"The worker failed: {detail}")
