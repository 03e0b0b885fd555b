"""`round_robin`: each request goes to the next candidate in worker-id order.

Rule of this file: the only state is a turn counter advanced once per decision, so the
sequence is deterministic for a given sequence of calls (no clock, no randomness).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.router.policies.base import BasePolicy, PolicyContext, require_candidates
from homing.router.types import RouteDecision, RouteRequest, WorkerSnapshot


@dataclass(frozen=True)
class RoundRobinConfig:
    """No options; present so every policy has a `<Name>Config`."""


class RoundRobinPolicy(BasePolicy):
    """Cycles over the candidates sorted by worker id: turn k picks candidate `k mod n`."""

    name = "round_robin"

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config or RoundRobinConfig()
        self._turn = 0

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """Next worker in the cycle; raises `NoWorkerAvailable` on an empty candidate set."""
        require_candidates(workers)
        ordered = sorted(workers, key=lambda w: w.worker_id)
        chosen = ordered[self._turn % len(ordered)]
        self._turn += 1
        prompt_tokens = len(request.prompt_ids)
        return RouteDecision(chosen.worker_id, "round_robin", uncached_tokens=prompt_tokens)


def build_round_robin(context: PolicyContext) -> RoundRobinPolicy:
    """Factory for the registry."""
    return RoundRobinPolicy()
