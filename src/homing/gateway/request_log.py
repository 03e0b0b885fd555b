"""The request log: one `request_done` report per request, request ids and trace context.

Rule of the file: every request reports its end exactly once, through the service's
`RequestRecorder` (`homing.obs.requests`: the log line, the metrics and the SLO verdict): a
`Generation` reports its own; a request refused or abandoned before it reached one reports
through `RequestLog.rejected` or `RequestLog.cancelled`.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from homing.clock import Clock
from homing.gateway.errors import APIError
from homing.obs.requests import RequestDone, RequestRecorder

# W3C Trace Context level 1, section 3.2: version 00, 32 and 16 lower-case hex digits (not
# all zeros), 2 of flags. Other versions may append fields after a dash.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True)
class TraceContext:
    """A request's W3C `traceparent`: its `trace_id`, parent `span_id` and `flags`
    (lower-case hex)."""

    trace_id: str
    span_id: str
    flags: str

    @property
    def header(self) -> str:
        """The version-00 `traceparent` to pass on (a later version's extra fields are
        dropped, as the recommendation says a version-00 participant does)."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def parse_traceparent(value: str | None) -> TraceContext | None:
    """The trace context of a `traceparent` header value; None when absent or invalid (an
    invalid one is ignored, as the W3C recommendation says, never refused)."""
    if not value or len(value) > 512:
        return None
    m = _TRACEPARENT.match(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"}:
        return None
    if set(span_id) == {"0"}:
        return None
    return TraceContext(trace_id=trace_id, span_id=span_id, flags=flags)


class RequestLog:
    """Reports the requests that never reached a `Generation` to `recorder`, timed on
    `clock`."""

    def __init__(self, recorder: RequestRecorder, *, clock: Clock) -> None:
        self.recorder = recorder
        self.clock = clock

    def rejected(
        self,
        request_id: str,
        err: APIError,
        *,
        model: str = "",
        tenant: str | None = None,
        started_at: float | None = None,
        **fields: object,
    ) -> None:
        """The one report of a request refused before it reached a worker. `model`: the
        served model it named, when it named one ("" otherwise: never a client's string);
        `started_at`: the clock's time at its arrival, for its end-to-end time."""
        self.recorder.done(
            RequestDone(
                request_id=request_id,
                outcome=f"error_{err.status}",
                model=model,
                tenant=tenant,
                status=err.status,
                error_code=err.code,
                e2e_s=None if started_at is None else self.clock.now() - started_at,
                fields=dict(fields),
            )
        )

    def cancelled(
        self, request_id: str, *, model: str = "", tenant: str | None = None, **fields: object
    ) -> None:
        """The one report of a request whose client went away before it reached a worker."""
        self.recorder.done(
            RequestDone(
                request_id=request_id,
                outcome="client_closed",
                model=model,
                tenant=tenant,
                fields=dict(fields),
            )
        )


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
