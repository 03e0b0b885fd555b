"""Which replicas to remove when a pool scales down: the ones whose removal costs least (pure).

Rule of this file: `choose_victims` orders the candidates by what removing each one costs and
returns the cheapest `count`; it reads plain numbers (`VictimCandidate`) and does no I/O. The
caller fills a candidate from the pool (phase, streams in flight) and the router
(`Router.cache_value`: blocks only that worker holds, and those of them matched recently),
then drains the chosen workers; draining lets their streams finish, so nothing is killed.

The order, cheapest first:
1. phase: an `ejected` worker first (outlier detection took it out as the slow or failing
   one, so removing it costs no good capacity whatever its cache holds), then a `cordoned`
   one (an operator already took it out of routing), then the rest (`ready`, and `joining`,
   which holds nothing yet and so sorts first among them by cost). `draining` and `gone`
   workers are already leaving and are never chosen: removing one again frees nothing.
2. streams in flight, fewest first: each is a request the drain has to wait for.
3. cache cost (`cache_cost`), least first: the prefix blocks that leave with the worker,
   since no other live worker holds them, a recently matched one weighing `RECENT_WEIGHT`.
4. worker id: equal costs give the same answer every time, whatever the input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.engines.lifecycle import Phase

#: A block matched by a lookup since the index's last eviction pass (its CLOCK reference set)
#: is worth this many idle ones: a matched prefix (a system prompt, a conversation's earlier
#: turns) is likely to be hit again within the window the scaler looks at, and losing it
#: costs that many re-prefills, while an idle block is only held until its room is needed.
#: The factor is a judgement, not a measurement: it lets a worker with a small hot cache
#: outweigh one with a several times larger cold one.
RECENT_WEIGHT = 4.0

_PHASE_RANK: dict[str, int] = {
    Phase.EJECTED: 0,
    Phase.CORDONED: 1,
    Phase.READY: 2,
    Phase.JOINING: 2,
}
"""Phase -> its place in the order (lower goes first); phases absent are never chosen."""

_NOT_CHOSEN = frozenset({Phase.DRAINING, Phase.GONE})


@dataclass(frozen=True)
class VictimCandidate:
    """One worker that scale-down may remove.

    `in_flight`: its streams in flight (>= 0). `unique_blocks`: prefix blocks only it holds
    (`homing.router.index.CacheValue.unique_blocks`, >= 0); `unique_recent_blocks`: those of
    them matched recently (0 <= it <= `unique_blocks`). `phase`: its lifecycle phase, a
    `homing.engines.lifecycle.Phase` value. ValueError for values out of range or an unknown
    phase.
    """

    worker_id: str
    in_flight: int
    unique_blocks: int
    unique_recent_blocks: int
    phase: str = "ready"

    def __post_init__(self) -> None:
        if self.in_flight < 0:
            raise ValueError(f"in_flight must be >= 0, got {self.in_flight}")
        if not 0 <= self.unique_recent_blocks <= self.unique_blocks:
            raise ValueError(
                "need 0 <= unique_recent_blocks <= unique_blocks, got "
                f"{self.unique_recent_blocks} and {self.unique_blocks}"
            )
        if self.phase not in _PHASE_RANK and self.phase not in _NOT_CHOSEN:
            known = ", ".join(p.value for p in Phase)
            raise ValueError(f"unknown phase {self.phase!r} (known: {known})")


def cache_cost(c: VictimCandidate) -> float:
    """What `c`'s cache is worth, in idle-block equivalents: `unique_blocks + (RECENT_WEIGHT -
    1) * unique_recent_blocks` (a recent block counts `RECENT_WEIGHT` times in all)."""
    return c.unique_blocks + (RECENT_WEIGHT - 1.0) * c.unique_recent_blocks


def removal_key(c: VictimCandidate) -> tuple[int, int, float, str]:
    """`c`'s place in the removal order (lower goes first): (phase rank, streams in flight,
    cache cost, worker id); see the module docstring. KeyError for a phase never chosen."""
    return (_PHASE_RANK[c.phase], c.in_flight, cache_cost(c), c.worker_id)


def choose_victims(candidates: Sequence[VictimCandidate], count: int) -> list[VictimCandidate]:
    """The `count` cheapest to remove, cheapest first: ejected, then cordoned, then the rest;
    within each, fewest in flight, then least `cache_cost`, then worker id (stable,
    deterministic: the input order does not matter). Draining and gone candidates are
    skipped. Fewer than `count` eligible: all of them. ValueError for a negative `count`
    or a worker id given twice.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    ids = [c.worker_id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError(f"a worker id is given twice among {sorted(ids)}")
    eligible = [c for c in candidates if c.phase not in _NOT_CHOSEN]
    return sorted(eligible, key=removal_key)[:count]
