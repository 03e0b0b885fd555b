"""cache_aware's cost pass over the candidate snapshots in C (src/homing/router/_native/cost.c).

Same decisions as `CacheAwarePolicy._cheapest_python` (tests/unit/router/
test_router_native_cost.py); costs in double precision.
"""

from collections.abc import Callable, Container, Sequence
from typing import Any

def bind(snapshot_type: type, /) -> None:
    """Read `snapshot_type`'s fields through its slot descriptors (other objects are read
    by attribute name). TypeError when a field is not a slot."""

def load_total(workers: Sequence[Any], /) -> tuple[int, bool]:
    """Sum over `workers` of `max(in_flight, running + waiting)` (requests), and whether
    one of them drains. AttributeError / TypeError for objects without those int fields."""

def cheapest(
    workers: Sequence[Any],
    matched: dict[str, int],
    device: dict[str, int] | None,
    prompt_tokens: float,
    prefill: float,
    queue: float,
    decode: float,
    lower_tier_worth: float,
    max_token_usage: float,
    max_waiting: float,
    bound: int | None,
    useful: float,
    oldest: dict[str, float],
    sums: dict[str, int],
    pending: Callable[[str, float], int],
    vetoed: list[str],
    /,
) -> tuple[Any, float, float, float] | None:
    """The cost pass of `CacheAwarePolicy._cheapest_python`: vetoed worker ids are appended
    to `vetoed`; returns (the winner: the cheapest eligible snapshot among those whose
    effective match is near the largest when it is `useful`, the largest and smallest
    effective match among eligible workers, the largest effective match of a vetoed worker)
    in tokens, or None when every worker is vetoed. `pending(worker, since)` is called when a
    worker's oldest ledger entry predates its load record (it drops the absorbed entries)."""

def ring_loads(
    workers: Sequence[Any],
    queue: float,
    decode: float,
    oldest: dict[str, float],
    sums: dict[str, int],
    pending: Callable[[str, float], int],
    vetoed: Container[str],
    full: int,
    /,
) -> tuple[dict[str, int], dict[str, float]]:
    """`CacheAwarePolicy._ring_loads_python`: per worker id its load (`full` for an id in
    `vetoed`) and its queue and decode cost `queue * Q + decode * L` (prompt-token
    equivalents), Q its queued prefill tokens with the ledger's pending ones."""
