"""What a request does when its worker fails: retry elsewhere, migrate the stream, or fail.

Rule of the file: pure decisions over plain data; no I/O, no clock, no budget spending (the
caller spends the model's retry budget when a decision says so, and counts the outcome).

A worker failure that another replica may not share (`RETRYABLE_CODES`) is retried on
another replica while nothing has reached the client (`before_first_byte`): at most
`max_retries` times. After the first byte a stream may migrate (`mid_stream`): once per
request (`MAX_MIGRATIONS`), never a constrained stream (the new worker's grammar would start
from its initial state, not where the choice is) nor one that asked for log probabilities,
and only while the prompt plus the tokens produced fit the model's prompt limit. A stream
whose new replica fails before its first token is retried (a retry, not a second migration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Stream migrations per request (`router.migrate_streams`): the second failure is the
#: client's, as Dynamo's request migration limit of 1 by default.
MAX_MIGRATIONS = 1

#: Engine statuses (gRPC status code names) that say the worker went away, not that the
#: request failed there:
#: UNAVAILABLE (it is unreachable), CANCELLED (a worker shutting down cancels its calls; our
#: own cancellations never surface as a status) and ABORTED (the worker ended the request
#: itself, e.g. on restart). INTERNAL and the like are not retried: a request that makes
#: one worker fail would make the next fail too, and count against its health as well.
#: RESOURCE_EXHAUSTED (its queue or KV pool is full, SGLang's 429) is that worker's state too.
RETRYABLE_CODES: frozenset[str] = frozenset(
    {"UNAVAILABLE", "CANCELLED", "ABORTED", "RESOURCE_EXHAUSTED"}
)

Action = Literal["retry", "migrate", "fail"]
Counter = Literal["retry", "migration"]


@dataclass(frozen=True)
class Decision:
    """What to do with a failure: `action`; `counter` ("retry" or "migration") is where its
    outcome is counted (`homing.gateway.metrics`), None when nothing is counted; `outcome`
    is the refusal's counted outcome for a "fail" (e.g. "max_retries"), None otherwise.
    A "retry" or "migrate" spends one unit of the model's retry budget first; when the
    budget refuses, the caller fails with outcome "budget_exhausted" on `counter`."""

    action: Action
    counter: Counter | None = None
    outcome: str | None = None


FAIL = Decision("fail")
RETRY = Decision("retry", counter="retry")
MIGRATE = Decision("migrate", counter="migration")


@dataclass(frozen=True)
class WorkerFailure:
    """How a failed engine call reads: `retryable` on another replica; `refused`: the worker
    was full (RESOURCE_EXHAUSTED), not failing, so no error is counted against it;
    `reported`: the pool's health accounting hears of it (a transport failure that is not
    our own whole-request deadline)."""

    retryable: bool
    refused: bool
    reported: bool


def classify(code: str, *, transport: bool) -> WorkerFailure:
    """The reading of an engine call that failed with status `code` (its gRPC name, e.g.
    "UNAVAILABLE"; `transport`: the call itself broke, not the request)."""
    return WorkerFailure(
        retryable=code in RETRYABLE_CODES,
        refused=code == "RESOURCE_EXHAUSTED",
        reported=transport and code != "DEADLINE_EXCEEDED",
    )


def before_first_byte(*, interrupted: bool, retries: int, max_retries: int) -> Decision:
    """A retryable failure before anything reached the client: retry on another replica
    unless the gateway ended the request (`interrupted`, nothing counted) or it already
    had `max_retries` retries ("max_retries")."""
    if interrupted:
        return FAIL
    if retries >= max_retries:
        return Decision("fail", counter="retry", outcome="max_retries")
    return RETRY


@dataclass(frozen=True)
class StreamState:
    """A stream whose worker failed after its first byte reached the client.

    `migrates`: the service migrates streams and this one streams; `interrupted`: the gateway
    ended it; `constrained`: a grammar constrains it (`response_format`, tool schemas);
    `logprobs`: it reports log probabilities; `migrations` / `retries`: done so far;
    `silent_since_migration`: it migrated before and its current replica has sent no token
    yet; `resume_tokens`: prompt plus the longest open choice's tokens, against
    `max_prompt_tokens`."""

    migrates: bool
    interrupted: bool
    constrained: bool
    logprobs: bool
    migrations: int
    retries: int
    max_retries: int
    silent_since_migration: bool
    resume_tokens: int
    max_prompt_tokens: int


def mid_stream(s: StreamState) -> Decision:
    """Migrate the stream, retry its migration, or fail it (module docstring), in that
    order of checks: not migrating or interrupted (nothing counted), "constrained",
    "logprobs", a silent new replica (as `before_first_byte`), "max_migrations",
    "too_long"."""
    if not s.migrates or s.interrupted:
        return FAIL
    if s.constrained:
        return Decision("fail", counter="migration", outcome="constrained")
    if s.logprobs:  # kept simple: the resumed stream's entries are not rebased
        return Decision("fail", counter="migration", outcome="logprobs")
    if s.silent_since_migration:
        return before_first_byte(interrupted=False, retries=s.retries, max_retries=s.max_retries)
    if s.migrations >= MAX_MIGRATIONS:
        return Decision("fail", counter="migration", outcome="max_migrations")
    if s.resume_tokens > s.max_prompt_tokens:
        return Decision("fail", counter="migration", outcome="too_long")
    return MIGRATE
