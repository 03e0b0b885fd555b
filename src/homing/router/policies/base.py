"""The policy interface: one required method, `select`, over plain snapshots.

Rule of this file: a policy is pure decision code. It reads the request, the candidate
snapshots and (for cache-aware ones) the prefix index it was built with, and returns a
`RouteDecision`; it never does I/O, sleeps, reads the clock except through the injected
`Clock`, or uses randomness. An empty candidate set raises `NoWorkerAvailable`.
Policies are built by factories registered by name (`PolicyFactory`), explicitly, at the
composition root (`homing.router.router.Router`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from homing.clock import Clock
from homing.router.index import PrefixIndex
from homing.router.types import NoWorkerAvailable, RouteDecision, RouteRequest, WorkerSnapshot


@runtime_checkable
class Policy(Protocol):
    """Picks one worker among candidates for a request."""

    name: str

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """The chosen worker; raises `NoWorkerAvailable` when `workers` is empty."""
        ...


@dataclass(frozen=True)
class PolicyContext:
    """What a factory may hand to the policy it builds: the model's index and the clock."""

    index: PrefixIndex
    clock: Clock


PolicyFactory = Callable[[PolicyContext], Policy]


def require_candidates(workers: Sequence[WorkerSnapshot]) -> None:
    """Raise `NoWorkerAvailable` when there is nothing to choose from."""
    if not workers:
        raise NoWorkerAvailable("no healthy worker to route to")
