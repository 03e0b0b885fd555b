"""The policy interface: one required method, `select`, over plain snapshots.

Rule of this file: a policy is pure decision code. It reads the request, the candidate
snapshots and (for cache-aware ones) the affinity index and dispatch ledger it was built
with, and returns a `RouteDecision`; it never does I/O, sleeps, reads the clock except
through the injected `Clock`, or uses randomness. An empty candidate set raises
`NoWorkerAvailable`. Policies are built by factories registered by name (`PolicyFactory`),
explicitly, at the composition root (`homing.router.router.Router`). Lifecycle hooks have
no-op defaults in `BasePolicy` (the shape of smg's `LoadBalancingPolicy`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from homing.clock import Clock
from homing.router.index import PrefixIndex
from homing.router.ledger import DispatchLedger
from homing.router.types import NoWorkerAvailable, RouteDecision, RouteRequest, WorkerSnapshot


@runtime_checkable
class Policy(Protocol):
    """Picks one worker among candidates for a request."""

    name: str

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """The chosen worker; raises `NoWorkerAvailable` when `workers` is empty."""
        ...

    def on_worker_removed(self, worker_id: str) -> None:
        """`worker_id` left the pool for good."""
        ...


class BasePolicy:
    """No-op lifecycle hooks for policies that keep no per-worker state."""

    def on_worker_removed(self, worker_id: str) -> None:
        """Nothing to forget."""


@dataclass(frozen=True)
class PolicyContext:
    """What a factory may hand to the policy it builds: the model's index, the clock and
    the router's dispatch ledger."""

    index: PrefixIndex
    clock: Clock
    ledger: DispatchLedger = field(default_factory=DispatchLedger)


PolicyFactory = Callable[[PolicyContext], Policy]


def require_candidates(workers: Sequence[WorkerSnapshot]) -> None:
    """Raise `NoWorkerAvailable` when there is nothing to choose from."""
    if not workers:
        raise NoWorkerAvailable("no healthy worker to route to")
