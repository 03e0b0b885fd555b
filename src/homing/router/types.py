"""Plain data crossing the router boundary: requests in, worker snapshots in, decisions out.

Rule of this file: dataclasses (frozen, but for the per-request `WorkerSnapshot`) and one
exception, no behaviour beyond small derived
values. The gateway builds `WorkerSnapshot`s from the pool's live `WorkerState`s (see
`snapshot_from_state`) and hands them to `Router.select`; nothing here touches I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from homing.engines.pool import WorkerState


class NoWorkerAvailable(Exception):
    """Raised by `select` when the candidate set is empty (the gateway answers 503)."""


@dataclass(frozen=True)
class RouteRequest:
    """What the router may look at for one request.

    `prompt_ids`: the tokenized prompt (token ids, as sent to the engine).
    `session_key`: a stable conversation key (`x-session-id` header or the OpenAI `user`
    field) when the client gives one; consistent hashing places cold requests by it.
    """

    prompt_ids: Sequence[int]
    session_key: str | None = None


@dataclass(slots=True)
class WorkerSnapshot:
    """One candidate worker as the policy sees it at decision time (read-only by contract;
    not frozen because the gateway builds one per healthy worker for every request, and a
    frozen dataclass's `__init__` costs 3x: 1.5 us against 0.5 us, ~60 us a request at 64
    workers; so it is unhashable).

    `in_flight`: requests this gateway has dispatched and not yet finished (own accounting,
    exact and immediate; with several gateway processes, all of theirs). `running` /
    `waiting`: the engine's own counts from its latest EngineLoad record (all clients, lags
    by one scheduler step or heartbeat).
    `token_usage`: KV-cache utilisation in [0, 1] as the engine reports it (SGLang's excludes
    evictable radix-cache pages; other engines' may include retained prefix cache).
    `active_token_usage`: the record's non-evictable occupancy in [0, 1], None when the
    engine does not report it (`filters.kv_usage` prefers it). `max_running_requests`: the
    engine's admission window (0 = unknown).
    `queued_prefill_tokens`: uncached prompt tokens queued on the engine: the record's
    `waiting_uncached_tokens` (waiting requests' tokens not served from its prefix cache, so
    lost cache shows here as load), else its `prefill_pending_tokens` (every prompt token of
    requests without output yet, cached or not: an upper bound), None when it reports neither.
    `load_at`: clock time (s) of that record (None: no record yet); the router adds its own
    dispatches made after it. `draining`: the worker takes no new requests unless every
    candidate drains.
    """

    worker_id: str
    in_flight: int = 0
    running: int = 0
    waiting: int = 0
    token_usage: float = 0.0
    active_token_usage: float | None = None
    max_running_requests: int = 0
    queued_prefill_tokens: int | None = None
    load_at: float | None = None
    draining: bool = False

    @property
    def load(self) -> int:
        """Requests on the worker, in requests: `max(in_flight, running + waiting)`.

        The engine counts include this gateway's own requests once they arrive, so summing
        them with `in_flight` would double count; the max takes whichever view is fresher
        (ours right after a dispatch, the engine's when other gateways also send there).
        """
        return max(self.in_flight, self.running + self.waiting)


@dataclass(frozen=True)
class RouteDecision:
    """The chosen worker and why.

    `branch` names the rule that decided, for logs and metrics:
    - "exact_hit" / "approx_hit": a worker holding the longest useful prefix (or one near
      it) was chosen (credited by its KV events / by the router's own approximate records);
    - "veto": the holder of a longer useful prefix was overloaded, so it was passed over;
    - "ring": no useful prefix; the consistent-hash ring's first choice took it;
    - "overflow": no useful prefix; the ring walked past full workers;
    - "overload": every candidate was overloaded; the near-best of all was chosen;
    - "round_robin" / "load": the policies of those names.
    `matched_tokens`: prompt tokens the chosen worker holds per the index (0 if unknown).
    `uncached_tokens`: the prompt tokens it will have to prefill by the same estimate.
    `best_worker_id` / `best_tokens`: the worker the index credits with the longest prefix
    of the prompt (any tier, every worker it tracks: candidates or not, approximate credits
    included; the first such worker on a tie) and that prefix in tokens, up to the prompt's
    last full block ("" and 0 when none holds any; None for a policy that does not consult
    the index). `best_tokens - matched_tokens` is the prefix the decision gave up by the
    index's account.
    """

    worker_id: str
    branch: str
    matched_tokens: int = 0
    uncached_tokens: int = 0
    best_worker_id: str | None = None
    best_tokens: int | None = None


def snapshot_from_state(state: WorkerState) -> WorkerSnapshot:
    """Build a `WorkerSnapshot` from a pool `WorkerState` (zeros where no load record yet;
    `active_token_usage` None where the engine does not report it)."""
    load = state.load
    draining = state.draining
    in_flight = state.in_flight_all
    if load is None:
        return WorkerSnapshot(worker_id=state.worker_id, in_flight=in_flight, draining=draining)
    queued = load.waiting_uncached_tokens
    if queued is None:
        queued = load.prefill_pending_tokens
    return WorkerSnapshot(
        worker_id=state.worker_id,
        in_flight=in_flight,
        running=load.running,
        waiting=load.waiting,
        token_usage=load.token_usage,
        active_token_usage=load.active_token_usage,
        max_running_requests=load.max_running_requests,
        queued_prefill_tokens=queued,
        load_at=load.updated_at,
        draining=draining,
    )
