"""The Router facade: one prefix index and one policy for one model's pool.

Rule of this file: composition only. The router owns the `PrefixIndex` (fed by
`apply_kv_batch`, which converts the wire batch at the edge via `homing.router.events`) and
delegates `select` to the policy built from the registry by name. No I/O; the clock is
injected and read only to stamp event arrival per worker. Sequence-number bookkeeping
(gaps, resubscription) belongs to the pool's KV-event task, which calls `flush_worker`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from smg_grpc_proto.generated import common_pb2

from homing.clock import Clock, SystemClock
from homing.router.events import KvEvent, events_from_batch
from homing.router.index import DEFAULT_MAX_BLOCKS, PrefixIndex
from homing.router.policies import BUILTIN_POLICIES, Policy, PolicyContext, PolicyFactory
from homing.router.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from homing.router.types import RouteDecision, RouteRequest, WorkerSnapshot


class Router:
    """Routes one model's requests: `select` a worker, mirror the workers' KV events.

    `policy`: a name in `registry` (default `BUILTIN_POLICIES`: "round_robin",
    "least_load", "cache_aware"); ValueError for an unknown name.
    `block_size`: tokens per KV block; must equal the workers' page size.
    `cache_aware`: config for the built-in cache_aware policy (None: defaults).
    """

    def __init__(
        self,
        policy: str = "cache_aware",
        *,
        block_size: int = 16,
        clock: Clock | None = None,
        registry: Mapping[str, PolicyFactory] | None = None,
        cache_aware: CacheAwareConfig | None = None,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.index = PrefixIndex(block_size, max_blocks=max_blocks)
        factories: dict[str, PolicyFactory] = dict(
            BUILTIN_POLICIES if registry is None else registry
        )
        if cache_aware is not None:
            config = cache_aware
            factories["cache_aware"] = lambda ctx: CacheAwarePolicy(ctx.index, config)
        if policy not in factories:
            known = ", ".join(sorted(factories))
            raise ValueError(f"unknown routing policy {policy!r} (known: {known})")
        self.policy: Policy = factories[policy](PolicyContext(index=self.index, clock=self.clock))
        self.decisions: Counter[str] = Counter()
        self._last_event_at: dict[str, float] = {}

    @property
    def policy_name(self) -> str:
        """Name of the active policy."""
        return self.policy.name

    @property
    def block_size(self) -> int:
        """Tokens per KV block the index hashes."""
        return self.index.block_size

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """The worker for `request` among `workers` (healthy candidates only, chosen by caller).

        Raises `NoWorkerAvailable` when `workers` is empty.
        """
        decision = self.policy.select(request, workers)
        self.decisions[decision.branch] += 1
        return decision

    def apply_kv_batch(self, worker_id: str, batch: common_pb2.KvEventBatch) -> None:
        """Apply the events of one (in-order, non-duplicate) batch from `worker_id`'s stream."""
        self.apply_events(worker_id, events_from_batch(batch))

    def apply_events(self, worker_id: str, events: Sequence[KvEvent]) -> None:
        """Apply plain-data events from `worker_id` in order."""
        self.index.apply_all(worker_id, events)
        self._last_event_at[worker_id] = self.clock.now()

    def flush_worker(self, worker_id: str) -> None:
        """Forget every block credited to `worker_id` (gap, reconnect, restart, removal)."""
        self.index.flush_worker(worker_id)

    def last_event_at(self, worker_id: str) -> float | None:
        """Clock time (s) of the last batch applied for `worker_id`, None if none yet."""
        return self._last_event_at.get(worker_id)
