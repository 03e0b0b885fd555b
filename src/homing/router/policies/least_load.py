"""`least_load`: the candidate with the fewest requests on it, KV usage breaking ties.

Rule of this file: load is `WorkerSnapshot.load` (`max(in_flight, running + waiting)`, in
requests); among workers with equal (load, token_usage) the choice rotates with a turn
counter so idle workers share a trickle of sequential requests instead of the first one
taking all of it. Pure: no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.router.policies.base import BasePolicy, PolicyContext, require_candidates
from homing.router.types import RouteDecision, RouteRequest, WorkerSnapshot


def pick_least_loaded(workers: Sequence[WorkerSnapshot], turn: int) -> WorkerSnapshot:
    """The worker minimising `(load, token_usage)`; ties broken by `turn` over worker ids.

    `workers` must not be empty (ValueError otherwise).
    """
    if not workers:
        raise ValueError("pick_least_loaded needs at least one worker")
    best = min((w.load, w.token_usage) for w in workers)
    tied = sorted(
        (w for w in workers if (w.load, w.token_usage) == best), key=lambda w: w.worker_id
    )
    return tied[turn % len(tied)]


@dataclass(frozen=True)
class LeastLoadConfig:
    """No options; present so every policy has a `<Name>Config`."""


class LeastLoadPolicy(BasePolicy):
    """Least loaded candidate (see module docstring); branch "load"."""

    name = "least_load"

    def __init__(self, config: LeastLoadConfig | None = None) -> None:
        self.config = config or LeastLoadConfig()
        self._turn = 0

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """Least loaded worker; raises `NoWorkerAvailable` on an empty candidate set."""
        require_candidates(workers)
        chosen = pick_least_loaded(workers, self._turn)
        self._turn += 1
        return RouteDecision(
            worker_id=chosen.worker_id, branch="load", uncached_tokens=len(request.prompt_ids)
        )


def build_least_load(context: PolicyContext) -> LeastLoadPolicy:
    """Factory for the registry."""
    return LeastLoadPolicy()
