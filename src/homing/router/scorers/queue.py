"""Queue term: prefill work already waiting on the worker, ahead of this request."""

from __future__ import annotations


def queued_prefill_tokens(engine_queued: int | None, dispatched_since_record: int) -> int:
    """`Q_engine + Q_own`, in tokens.

    Q_engine: the engine's own figure from its latest EngineLoad record
    (`prefill_pending_tokens`, else `waiting_uncached_tokens`; 0 when it reports neither).
    Q_own: uncached prompt tokens this router sent to the worker after that record was
    taken (`DispatchLedger`), which the record cannot contain yet. With first-come
    first-served scheduling the request waits for all of it before its own prefill starts.
    """
    return (engine_queued or 0) + dispatched_since_record
