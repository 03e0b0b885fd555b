"""Test doubles for code that runs a request (`homing.gateway.generation.Generation`).
Nothing here is used by the running gateway.

- `RecordingHost`: the smallest `GenerationHost` that routes as `InferenceService` does (the
  same `lease_replica`: a lease from the request's `ModelDispatch`, of its pinned version if
  any, 503 `no_capacity` when none can serve; one `RetryBudget` per model on the host's
  clock; the request counted in flight until it ends, then the model's admission woken),
  with no quotas unless given, and that keeps the retry and migration outcomes it is told
  (`retries`, `migrations`) instead of metrics.
- `prepared_request`: a `PreparedRequest` of given prompt token ids for a dispatch, with the
  defaults a plain completions request gets (no stops, no logprobs, SGLang's sampling
  defaults); any field may be overridden.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from homing.clock import Clock
from homing.fleet import Lease, ModelDispatch
from homing.gateway.generation import Generation
from homing.gateway.prepare import PreparedRequest
from homing.gateway.quotas.guard import QuotaGuard
from homing.gateway.retry_budget import RetryBudget, RetryPolicy
from homing.gateway.service import lease_replica
from homing.obs.requests import RequestRecorder
from homing.text.stops import StopSet


class RecordingHost:
    """A `GenerationHost` over the dispatches its requests name (module docstring).

    `clock`: the requests' clock. `retry`, `migrate_streams`, `request_timeout_s` (seconds):
    as `InferenceService`'s settings. `quotas`: charged when given. `recorder`: where each
    request reports its end (default: no metrics). Records: `retries` and `migrations`
    (Counter of (model id, outcome)), `in_flight` (requests open now), `opened` (requests
    ever counted in flight).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        retry: RetryPolicy | None = None,
        migrate_streams: bool = False,
        request_timeout_s: float = 600.0,
        quotas: QuotaGuard | None = None,
        recorder: RequestRecorder | None = None,
    ) -> None:
        self.clock = clock
        self.accepting = True
        self.quotas = quotas
        self.recorder = recorder or RequestRecorder(now=clock.now, metrics=None)
        self.request_timeout_s = request_timeout_s
        self.migrate_streams = migrate_streams
        self.retry = retry or RetryPolicy()
        self.retries: Counter[tuple[str, str]] = Counter()
        self.migrations: Counter[tuple[str, str]] = Counter()
        self.in_flight = 0
        self.opened = 0
        self._budgets: dict[str, RetryBudget] = {}

    def open(self, prepared: PreparedRequest) -> Generation:
        """A `Generation` of `prepared` on this host (routed when its block is entered)."""
        return Generation(self, prepared)

    def lease(
        self, prepared: PreparedRequest, exclude: Sequence[str] = (), slots: int | None = None
    ) -> Lease:
        """`InferenceService`'s lease (`homing.gateway.service.lease_replica`)."""
        return lease_replica(prepared, exclude, slots)

    def retry_budget(self, model_id: str) -> RetryBudget:
        """The model's retry budget (made on first use, on the host's clock)."""
        budget = self._budgets.get(model_id)
        if budget is None:
            budget = self._budgets[model_id] = RetryBudget(self.retry, now=self.clock.now)
        return budget

    def count_retry(self, model_id: str, outcome: str) -> None:
        """Keep a retryable failure's outcome in `retries`."""
        self.retries[model_id, outcome] += 1

    def count_migration(self, model_id: str, outcome: str) -> None:
        """Keep a stream migration's outcome in `migrations`."""
        self.migrations[model_id, outcome] += 1

    def track(self, generation: Generation) -> Callable[[], None]:
        """Count `generation` in flight until the returned callable is first called, which
        also wakes its model's admission."""
        model = generation.prepared.model
        self.in_flight += 1
        self.opened += 1
        left = False

        def leave() -> None:
            nonlocal left
            if not left:
                left = True
                self.in_flight -= 1
                model.wake()

        return leave


def prepared_request(
    model: ModelDispatch,
    prompt_ids: Sequence[int],
    *,
    clock: Clock,
    max_new_tokens: int = 16,
    request_id: str = "req-0",
    **overrides: Any,
) -> PreparedRequest:
    """A completions request of `prompt_ids` (token ids) for `model`, arriving now on
    `clock`: streamed, one choice, at most `max_new_tokens` tokens, no stops, SGLang's
    sampling defaults; `overrides` replace any other `PreparedRequest` field (a `stop_strings`
    override compiles its `stop_set` too). TypeError for an unknown field."""
    prepared = PreparedRequest(
        request_id=request_id,
        kind="text",
        model=model,
        prompt_ids=list(prompt_ids),
        max_new_tokens=max_new_tokens,
        max_tokens_given=True,
        n=1,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        min_p=0.0,
        repetition_penalty=1.0,
        logit_bias={},
        json_schema=None,
        stop_strings=[],
        stop_set=StopSet(),
        stop_token_ids=[],
        ignore_eos=False,
        skip_special_tokens=True,
        stream=True,
        include_usage=False,
        session_key=None,
        created=int(clock.wall()),
        arrived_at=clock.now(),
    )
    if "stop_strings" in overrides and "stop_set" not in overrides:
        overrides["stop_set"] = StopSet(overrides["stop_strings"])
    return dataclasses.replace(prepared, **overrides)
