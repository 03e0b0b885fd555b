"""A request's accounting: its usage, its attempts' records, its timing and its one record.

Rule of the file: plain bookkeeping over times the caller reads from its clock (seconds);
no tasks, no queues. Usage counts the prompt once and completion tokens summed over
choices. Each attempt (one lease on one replica) is that replica's own record in the
per-replica stats (`homing.obs.replica`): the attempt that ends the request carries its own
TTFT (from its own start), TPOT and tokens, so no replica is timed for another's failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from homing.gateway.errors import APIError
from homing.gateway.prepare import PreparedRequest
from homing.obs.replica import AttemptRecord
from homing.obs.requests import RequestDone


@dataclass
class Usage:
    """Token counts of a request: prompt counted once, completion summed over choices."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """prompt + completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Attempt:
    """One lease's part of a request: the replica, when it started (clock s), the input
    tokens each choice gave it, and what it sent back (tokens over its choices, the first
    and last token's times, its own cached-token count)."""

    worker_id: str
    started_at: float
    prompt_tokens: int
    choices: int
    tokens: int = 0
    cached_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    failed: bool = False
    refused: bool = False  # it answered RESOURCE_EXHAUSTED: full, not failing

    def note(self, tokens: int, cached_tokens: int, now: float) -> None:
        """`tokens` more arrived at `now`; the worker reported `cached_tokens`."""
        self.cached_tokens = max(self.cached_tokens, cached_tokens)
        if tokens:
            self.tokens += tokens
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now

    def record(self, *, failed: bool, timed: bool) -> AttemptRecord:
        """Its replica-stats record; `timed`: the engine streamed, so token times mean
        something."""
        first, last = self.first_token_at, self.last_token_at
        ttft = first - self.started_at if timed and first is not None else None
        per_choice = self.tokens / max(1, self.choices)
        tpot = None
        if timed and first is not None and last is not None and per_choice >= 2:
            tpot = (last - first) / (per_choice - 1)
        return AttemptRecord(
            worker_id=self.worker_id,
            failed=failed or self.failed,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=min(self.cached_tokens, self.prompt_tokens),
            ttft_s=ttft,
            tpot_s=tpot,
            completion_tokens=self.tokens,
        )


@dataclass
class Timeline:
    """When a request was opened and first routed, and when its first and last tokens
    came (clock s; None: not yet)."""

    opened_at: float
    routed_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    def routed(self, now: float) -> None:
        """The request reached a replica at `now` (the first time counts)."""
        if self.routed_at is None:
            self.routed_at = now

    def tokens_at(self, now: float) -> None:
        """Tokens of some choice arrived at `now`."""
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now

    def restart(self) -> None:
        """The request was routed again: the tokens before are void."""
        self.first_token_at = self.last_token_at = None

    def ttft_ms(self, arrived_at: float, *, streamed: bool) -> float | None:
        """Time to first token in ms, from `arrived_at` to the first token of any choice;
        None when none came, or when the engine sent each answer whole (not `streamed`: its
        first token's time is not known)."""
        if self.first_token_at is None or not streamed:
            return None
        return (self.first_token_at - arrived_at) * 1000.0

    def tpot_ms(self, tokens: int, choices: int, *, streamed: bool) -> float | None:
        """Mean time per output token after the first, in ms, for `tokens` summed over
        `choices`; None when the tokens did not arrive over time (fewer than 2 per choice,
        or not `streamed`)."""
        first, last = self.first_token_at, self.last_token_at
        if not streamed or first is None or last is None or tokens < 2:
            return None
        per_choice = tokens / max(1, choices)
        if per_choice < 2:
            return None
        return (last - first) * 1000.0 / (per_choice - 1)


def quota_tokens(usage: Usage, *, routed: bool) -> int:
    """The tokens a request's quota reservation settles at, by one rule on every path: what
    the engine was given and produced (prompt + completion). A request that never reached a
    worker (a 503 from admission or routing, a client gone while queued) uses none: its
    reservation is refunded whole (no requests, tokens or stream slot)."""
    return usage.total_tokens if routed else 0


@dataclass
class Outcome:
    """How a request ended, for its record: `outcome` (the log's), `refusal` (the error the
    client got, if any), `finish_reasons` per choice index, `worker_id` and `version` of
    its last replica ("" when none), `streamed` (the engine streamed its tokens)."""

    outcome: str
    refusal: APIError | None
    finish_reasons: dict[int, str]
    worker_id: str
    version: str
    streamed: bool
    fields: dict[str, object] = field(default_factory=dict)


def request_record(
    p: PreparedRequest,
    ended: Outcome,
    usage: Usage,
    timeline: Timeline,
    last_attempt: Attempt | None,
    *,
    now: float,
) -> RequestDone:
    """The request's one record (`homing.obs.requests.RequestDone`) as it ends at `now`."""
    reasons = [ended.finish_reasons.get(i) for i in range(p.n)]
    refused = ended.refusal if ended.outcome.startswith("error_") else None
    ttft = timeline.ttft_ms(p.arrived_at, streamed=ended.streamed)
    tpot = timeline.tpot_ms(usage.completion_tokens, p.n, streamed=ended.streamed)
    part = None
    if last_attempt is not None:
        part = last_attempt.record(failed=ended.outcome == "engine_error", timed=ended.streamed)
    fields: dict[str, object] = {
        "api_key": p.principal.key_id if p.principal is not None else None,
        "kind": p.kind,
        "n": p.n,
        "finish_reasons": reasons,
        **ended.fields,
    }
    if p.version_pin is not None:
        fields["version_pinned"] = True
    if p.trace is not None:
        fields["trace_id"] = p.trace.trace_id
        fields["parent_span_id"] = p.trace.span_id
    routed_at = timeline.routed_at
    return RequestDone(
        request_id=p.request_id,
        outcome=ended.outcome,
        model=p.model.model_id,
        version=ended.version,
        pinned=p.version_pin is not None,
        worker=ended.worker_id,
        tenant=p.tenant,
        status=refused.status if refused is not None else None,
        error_code=refused.code if refused is not None else None,
        ttft_s=None if ttft is None else ttft / 1000.0,
        tpot_s=None if tpot is None else tpot / 1000.0,
        e2e_s=now - p.arrived_at,
        queue_s=None if routed_at is None else routed_at - timeline.opened_at,
        routed_ttft_s=part.ttft_s if part is not None else None,
        choices=p.n,
        streamed=ended.streamed,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
        finish_reason="length" if "length" in reasons else "stop",
        fields=fields,
        worker_part=part,
    )
