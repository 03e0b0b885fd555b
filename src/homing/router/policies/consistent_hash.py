"""`consistent_hash`: bounded-load consistent hashing on a session key (no prefix index).

Rule of this file: the routing key decides where a request starts on the ring and load
decides only how far it walks. Key: the request's session key (`x-session-id` header or
the OpenAI `user` field) when given, else its first prompt block (`block_size` token ids;
the whole prompt when shorter), so a conversation's turns and requests sharing a system
prompt start at the same ring point. The first worker clockwise whose load is under
`load_bound(L, n, c, min_bound)` takes it (`homing.router.ring`, Mirrokni et al. 2018):
branch "ring" when that is the key's own worker, "overflow" when full workers were passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.router.filters import not_draining
from homing.router.hashing import token_bytes
from homing.router.policies.base import BasePolicy, PolicyContext, require_candidates
from homing.router.ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES, HashRing, key_hash, load_bound
from homing.router.types import RouteDecision, RouteRequest, WorkerSnapshot

#: Default floor of the bound (requests): below 4 in flight no worker counts as full, so a
#: lightly loaded pool keeps a key on its own worker (ours; an engine batch of 4 is far
#: from any limit).
DEFAULT_MIN_BOUND = 4


def routing_key(request: RouteRequest, block_size: int, skip_blocks: int = 0) -> int:
    """Ring position of `request`: hash of "session:" + session key, else of the uint32-LE
    bytes of its first prompt block (`block_size` tokens; all of them when fewer). With
    `skip_blocks` > 0 the block after the first `skip_blocks` is used instead (the last
    full block when the prompt is shorter): cache_aware passes the prefix every worker
    already holds, which cannot tell requests apart."""
    if request.session_key:
        return key_hash("session:" + request.session_key)
    prompt = request.prompt_ids
    if skip_blocks > 0:
        start = min(skip_blocks, max(len(prompt) // block_size - 1, 0)) * block_size
        return key_hash(token_bytes(prompt[start : start + block_size]))
    return key_hash(token_bytes(prompt[:block_size]))


@dataclass(frozen=True)
class ConsistentHashConfig:
    """Ring and bound: `vnodes` points per worker (160), balance `load_factor` c (1.25),
    `min_bound` floor of the bound in requests (4)."""

    vnodes: int = DEFAULT_VNODES
    load_factor: float = DEFAULT_LOAD_FACTOR
    min_bound: int = DEFAULT_MIN_BOUND


class ConsistentHashPolicy(BasePolicy):
    """Bounded-load consistent hashing (see module docstring)."""

    name = "consistent_hash"

    def __init__(self, block_size: int, config: ConsistentHashConfig | None = None) -> None:
        self.config = config or ConsistentHashConfig()
        self.block_size = block_size
        self.ring = HashRing(self.config.vnodes)

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """Ring choice under the bound; raises `NoWorkerAvailable` on an empty candidate set."""
        require_candidates(workers)
        candidates = not_draining(workers)
        self.ring.ensure(w.worker_id for w in candidates)
        loads = {w.worker_id: w.load for w in candidates}
        cfg = self.config
        bound = load_bound(sum(loads.values()), len(loads), cfg.load_factor, cfg.min_bound)
        chosen, passed = self.ring.pick(routing_key(request, self.block_size), loads, bound)
        if chosen is None:  # unreachable: some worker is at or below the mean < bound
            chosen = min(loads, key=lambda w: (loads[w], w))
        return RouteDecision(
            worker_id=chosen,
            branch="ring" if passed == 0 else "overflow",
            uncached_tokens=len(request.prompt_ids),
        )

    def on_worker_removed(self, worker_id: str) -> None:
        """Take the worker's points off the ring."""
        self.ring.remove(worker_id)


def build_consistent_hash(context: PolicyContext) -> ConsistentHashPolicy:
    """Factory for the registry (default config)."""
    return ConsistentHashPolicy(context.index.block_size)
