"""Decode term: requests the worker is running or holding, each slowing every step."""

from __future__ import annotations


def decode_load(in_flight: int, running: int, waiting: int) -> int:
    """`max(in_flight, running + waiting)`, in requests (`WorkerSnapshot.load`).

    Every running sequence adds its own decode token, KV reads and per-sequence overhead to
    each step of the worker (the sim's roofline step model: ~0.3-0.7 ms per sequence on
    llama-3.1-70b TP8), so the decode batch sets the request's TPOT and slows its prefill
    chunks; queued requests will join the batch. Our own count and the engine's overlap,
    hence the max.
    """
    return max(in_flight, running + waiting)
