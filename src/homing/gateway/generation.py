"""One routed request: its engine streams, its events, and its accounting.

Rule of the file: a `Generation` is an async context manager and event iterator. Entering it
charges the tenant's quota (`homing.gateway.quotas`, 429/503), waits for admission when every
replica is overloaded (`homing.gateway.admission`, 503) and routes it to a replica, then
runs the `n` engine streams; iterating it yields `TextDelta` and `ChoiceFinished` events in
order per choice. Leaving the block by any path (normal end, client disconnect, error,
cancellation) cancels the engine streams, which send `Abort`, releases the in-flight counts
and the quota ticket exactly once and writes the request's log line.

A worker failure is retried on another replica while nothing has reached the client, and a
stream whose worker fails after its first byte migrates, by the rules of
`homing.gateway.failover` (this file carries them out: it spends the model's retry budget,
`homing.gateway.retry_budget`, and counts each outcome). A retry refused, or no other
replica, gives the client the last failure's error (a 429 for a worker's
RESOURCE_EXHAUSTED). Transport failures are reported to the pool's health accounting; a
client's mistake never counts against a worker. A migrating stream's unfinished choices
resume on another replica with the prompt plus the tokens they already produced as input
and `max_new_tokens` less those; each choice's decoder keeps its state, so the text goes on
without a repeated or lost token and stop strings and detokenization continue across the
boundary. Usage stays the client's: prompt tokens of the original prompt, completion tokens
of every token delivered, cached tokens of the first attempt (`homing.gateway.accounting`
keeps the usage, the attempts' records and the request's record).

A request the gateway itself ends (`interrupt`: the drain timeout at shutdown) gets that
error, a stream as its last event.
The log line's `outcome`: "ok", "client_closed", "engine_error" (a worker failed it),
"timeout" (past `request_timeout_s`), "drained" (cut at shutdown), "worker_drained" or
"worker_removed" (its replica was taken away while it ran), "error_<status>" (refused
with that status, the worker's refusals of the request included) or "error" (a fault of
the gateway's own, a 500).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Protocol, cast

import grpc
import structlog

from homing.clock import Clock
from homing.engines.client import (
    EngineError,
    GenerateDone,
    GenerateParams,
    TokenChunk,
)
from homing.fleet import Lease
from homing.gateway import failover
from homing.gateway.accounting import (
    Attempt,
    Outcome,
    Timeline,
    Usage,
    quota_tokens,
    request_record,
)
from homing.gateway.channel import EventChannel
from homing.gateway.decoding import ChoiceDecoder, DetailedDecoder, DetailedStep, LoggedToken
from homing.gateway.errors import (
    APIError,
    from_engine_error,
    internal_error,
    replica_cut,
    shutting_down,
)
from homing.gateway.prepare import PreparedRequest
from homing.gateway.quotas.guard import QuotaGuard, QuotaTicket
from homing.gateway.retry_budget import RetryBudget, RetryPolicy
from homing.obs.requests import RequestRecorder
from homing.router.types import RouteDecision

log = structlog.get_logger("homing.request")

# Events a request holds for a consumer that has not taken them (a client slower than its
# engine): past this the choice tasks stop reading their engine streams, so gRPC flow control
# holds the rest back at the worker, and the gateway's memory per request stays bounded.
MAX_PENDING_EVENTS = 256


@dataclass(frozen=True)
class TextDelta:
    """New text for choice `index`."""

    index: int
    text: str


@dataclass(frozen=True)
class ChoiceFinished:
    """Choice `index` ended with `reason` ("stop", "length" or "abort")."""

    index: int
    reason: str


@dataclass(frozen=True)
class LogprobDelta(TextDelta):
    """New text for choice `index` of a detailed request (`PreparedRequest.detailed`) and the
    tokens it reports (`homing.gateway.decoding.DetailedDecoder`'s rules); `text` may be ""
    when only tokens without text are reported."""

    logprobs: tuple[LoggedToken, ...] = ()


Event = TextDelta | ChoiceFinished


class _Retry(Exception):
    """A worker failed in a way another replica may not: route again if nothing was sent."""

    def __init__(self, worker_id: str, error: EngineError) -> None:
        super().__init__(str(error))
        self.worker_id = worker_id
        self.error = error


class _Interrupt(Exception):
    """The gateway ended the request: `error` for the client, `outcome` for the log."""

    def __init__(self, error: APIError, outcome: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.outcome = outcome


class _Restarted:
    """A non-streamed request was routed again: what came before is void."""


class GenerationHost(Protocol):
    """What a `Generation` needs from the gateway that opened it (`InferenceService`), read
    when used: settings a reload changes take effect for the next decision."""

    clock: Clock
    accepting: bool  # False once the gateway drains
    quotas: QuotaGuard | None
    recorder: RequestRecorder
    request_timeout_s: float
    migrate_streams: bool
    retry: RetryPolicy

    def lease(
        self, prepared: PreparedRequest, exclude: Sequence[str] = (), slots: int | None = None
    ) -> Lease:
        """A lease on a replica not in `exclude` (`APIError` 503 when none can serve)."""
        ...

    def retry_budget(self, model_id: str) -> RetryBudget:
        """The model's retry budget."""
        ...

    def count_retry(self, model_id: str, outcome: str) -> None:
        """Count a retryable failure's outcome."""
        ...

    def count_migration(self, model_id: str, outcome: str) -> None:
        """Count a stream migration's outcome."""
        ...

    def track(self, generation: Generation) -> Callable[[], None]:
        """Count `generation` in flight from now; the callable, called once, stops."""
        ...


class Generation:
    """One routed request with `n` choices; an async context manager and event iterator.

    Attributes after entering: `worker_id` (the replica serving it) and `version` (its
    version label); after the end: `usage`, `finish_reasons`, `ttft_ms`, `tpot_ms`,
    `outcome`, `slo` (the SLO verdict, `homing.obs.slo`) and `engine_messages` (gRPC
    messages received from workers, every choice and attempt together).
    """

    def __init__(self, host: GenerationHost, prepared: PreparedRequest) -> None:
        self.host = host
        self.prepared = prepared
        self.worker_id: str | None = None
        self.version = ""
        self.slo: str | None = None
        self.usage = Usage(prompt_tokens=len(prepared.prompt_ids))
        self.finish_reasons: dict[int, str] = {}
        self.outcome = "ok"
        self.engine_messages = 0
        # Per choice, the tokens a non-streamed detailed answer reports (`collect_texts`).
        self.logprobs: list[list[LoggedToken]] = []
        # A non-streamed answer is one engine message per choice, unless stop strings
        # (matched here) need the tokens as they come, to end the choice at its stop.
        self._engine_streams = prepared.stream or bool(prepared.stop_set)
        # One task per choice reads its engine stream ahead of the consumer, so events that
        # pile up meanwhile go out together; they wait here, in order, for the consumer.
        self._events: EventChannel[Event | BaseException] = EventChannel(MAX_PENDING_EVENTS)
        self._tasks: list[asyncio.Task[None]] = []
        self._tried: list[str] = []  # workers routed to, in order
        # The engine ends a choice at its first stop token id (not under ignore_eos, SGLang's
        # rule); that token is counted but, as SGLang and vLLM do, not shown.
        self._hidden_stop_ids = frozenset(() if prepared.ignore_eos else prepared.stop_token_ids)
        # Where special tokens are shown (a tool-call parser reads them), the model's EOS
        # that ends the answer is not, as SGLang trims it; it is still reported.
        keeps_eos = prepared.ignore_eos or prepared.skip_special_tokens
        self._silent_ids = frozenset(() if keeps_eos else prepared.model.tokenizer.eos_token_ids)
        # Per choice of the current attempt: its decoder, which also counts its tokens.
        self._decoders: dict[int, ChoiceDecoder] = {}
        # Streams resume elsewhere when their worker fails mid-way (`_migrate`): per choice,
        # the token ids taken from its engine streams, and the choices that have ended.
        self._migrates = host.migrate_streams and prepared.stream
        self._produced: dict[int, list[int]] = {}
        self._ended: set[int] = set()
        self._retries = 0
        self._migrations = 0
        self._migrated_from: str | None = None
        self._interrupt: _Interrupt | None = None
        self._clock = host.clock
        self._timeline = Timeline(opened_at=self._clock.now())
        self._refusal: APIError | None = None  # the error the client got, if any
        self._open_choices = prepared.n
        self._lease: Lease | None = None
        self._attempt: Attempt | None = None  # the current lease's
        self._failure: str | None = None
        self._ticket: QuotaTicket | None = None
        self._untrack: Callable[[], None] | None = None
        self._route: dict[str, object] | None = None  # the first routing decision, logged
        # Engine-side ids are ours alone: a client's x-request-id may repeat across requests.
        self._engine_id = uuid.uuid4().hex

    # -- lifecycle --

    async def __aenter__(self) -> Generation:
        self._untrack = self.host.track(self)
        try:
            await self._start()
        except BaseException as err:
            if self._failure is None and self._interrupt is not None:
                self._failure = self._interrupt.outcome  # e.g. refused while queued
            self.outcome = self._failure or _outcome_of(err)
            if isinstance(err, APIError):
                self._refusal = err
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        unfinished = exc is not None or self._open_choices > 0
        if self._failure is not None:  # what ended it, read by the consumer
            self.outcome = self._failure
        elif self._interrupt is not None and unfinished:
            self.outcome = self._interrupt.outcome  # even if its consumer never read it
        elif exc is not None:
            self.outcome = _outcome_of(exc)
        elif self._open_choices > 0:
            self.outcome = "client_closed"
        await self._close()

    def interrupt(self, error: APIError, outcome: str) -> None:
        """End the request now (the gateway's own decision, e.g. the drain timeout): the
        consumer gets `error` (raised from entering or iterating), the log `outcome`."""
        if self._interrupt is None:
            self._interrupt = _Interrupt(error, outcome)
            self._events.put(self._interrupt)

    async def _start(self) -> None:
        """Charge the quota, wait for admission, then route, start the engine streams and
        wait for the first event (routing again once after a retryable failure)."""
        p = self.prepared
        host = self.host
        if not host.accepting:
            raise shutting_down()
        if host.quotas is not None:
            completion = p.max_new_tokens
            if not p.max_tokens_given:  # the whole context would starve low-TPM tenants
                completion = min(completion, host.quotas.settings.default_completion_reservation)
            self._ticket = await host.quotas.reserve(
                p.principal,
                tokens=len(p.prompt_ids) + p.n * completion,
                request_id=p.request_id,
            )
        priority = p.principal.priority if p.principal is not None else 0
        await p.model.admit(p.tenant, priority, p.request_id)
        if not host.accepting:  # the drain began while it waited
            raise shutting_down()
        self._route_and_launch()
        host.retry_budget(p.model.model_id).record_request()
        while True:
            first = await self._events.get()
            if isinstance(first, _Retry) and self._may_retry():
                await self._relaunch(first)
                continue
            if isinstance(first, BaseException):
                self._failure = self._failure_outcome(first)
                raise self._refuse(first)
            self._events.push_front(first)
            return

    def _may_retry(self) -> bool:
        """Whether a retryable failure may be retried now (`failover.before_first_byte`, its
        refusal counted if not); whether another replica is left is found when routing
        (`_relaunch`)."""
        decision = failover.before_first_byte(
            interrupted=self._interrupt is not None,
            retries=self._retries,
            max_retries=self.host.retry.max_retries,
        )
        return self._granted(decision)

    def _granted(self, decision: failover.Decision) -> bool:
        """Whether `decision` lets the request go on: a retry or migration whose budget unit
        is reserved now, before any await (failures that arrive together cannot all pass);
        a refusal, or a budget that refuses, is counted on its counter."""
        host, model = self.host, self.prepared.model.model_id
        count = host.count_retry if decision.counter == "retry" else host.count_migration
        if decision.action == "fail":
            if decision.outcome is not None:
                count(model, decision.outcome)
            return False
        if not host.retry_budget(model).try_spend():
            count(model, "budget_exhausted")
            return False
        return True

    def _route_and_launch(self) -> None:
        if self._interrupt is not None:
            self._failure = self._interrupt.outcome
            raise self._interrupt.error
        lease = self._take_lease(self.prepared.n)
        self._timeline.routed(self._clock.now())
        for index in range(self.prepared.n):
            self._launch(index, lease, resume=False)

    def _take_lease(self, slots: int, prompt_tokens: int | None = None) -> Lease:
        """A lease for `slots` choices on a replica not tried yet (raises `APIError` 503),
        each given `prompt_tokens` input tokens (default: the prompt's); it becomes the
        request's lease and attempt, and the attempt it replaces (which failed) is counted
        as its replica's error, unless that replica only refused it as full."""
        # The lease counts the choices in flight on the worker before any await, so the next
        # routing decision (even within the same burst) already sees them.
        lease = self.host.lease(self.prepared, exclude=self._tried, slots=slots)
        lease.on_cut = self._on_cut
        if self._route is None and lease.decision is not None:
            self._route = _route_fields(lease.decision, self._clock.wall())
        if self._attempt is not None and not self._attempt.refused:
            self.host.recorder.attempt_failed(
                self.prepared.model.model_id,
                self._attempt.record(failed=True, timed=self._engine_streams),
            )
        self._attempt = Attempt(
            worker_id=lease.worker_id,
            started_at=self._clock.now(),
            prompt_tokens=len(self.prepared.prompt_ids) if prompt_tokens is None else prompt_tokens,
            choices=slots,
        )
        self._lease = lease
        self._tried.append(lease.worker_id)
        self.worker_id = lease.worker_id
        self.version = lease.version
        return lease

    def _launch(self, index: int, lease: Lease, *, resume: bool) -> None:
        assert self._attempt is not None  # `_take_lease` made it with the lease
        task = self._run_choice(index, lease, self._attempt, resume=resume)
        self._tasks.append(asyncio.create_task(task))

    def _on_cut(self, reason: str) -> None:
        """The fleet took the replica away (a drain that timed out, a forced removal)."""
        self.interrupt(replica_cut(reason), reason)

    async def _relaunch(self, retry: _Retry) -> None:
        """Drop everything of the failed attempt and route the request again elsewhere."""
        log.info(
            "request_retried",
            request_id=self.prepared.request_id,
            worker=retry.worker_id,
            code=retry.error.code.name,
            error=retry.error.message,
        )
        await self._cancel_tasks()
        self._events.clear()
        self._decoders.clear()
        self._produced.clear()
        self._ended.clear()
        self.finish_reasons.clear()
        self._open_choices = self.prepared.n
        self._timeline.restart()
        model = self.prepared.model.model_id
        budget = self.host.retry_budget(model)  # `_may_retry` reserved this retry
        if self._interrupt is not None:
            budget.refund()
            self._failure = self._interrupt.outcome
            raise self._interrupt.error
        try:
            self._route_and_launch()
        except APIError:  # no other replica: the client learns what failed the first
            budget.refund()
            self.host.count_retry(model, "no_other_worker")
            self._failure = "engine_error"
            raise self._api_error(retry) from None
        self._retries += 1
        self.host.count_retry(model, "retried")

    async def _migrate(self, retry: _Retry) -> bool:
        """Resume every unfinished choice of a stream whose worker failed mid-way on another
        replica, with one lease for them all, when `failover.mid_stream` says so; a choice
        that needs no engine to end (`_ended_locally`) ends here. When the replica it
        migrated to failed before its first token, this is a retry of that migration
        (counted as a retry). False when it may not, its outcome counted, so the client
        gets `retry`'s error."""
        p, host = self.prepared, self.host
        model = p.model.model_id
        open_choices = [i for i in range(p.n) if i not in self._ended]
        longest = max((len(self._produced.get(i, ())) for i in open_choices), default=0)
        attempt = self._attempt
        decision = failover.mid_stream(
            failover.StreamState(
                migrates=self._migrates,
                interrupted=self._interrupt is not None,
                constrained=p.constrained,
                logprobs=p.logprobs,
                migrations=self._migrations,
                retries=self._retries,
                max_retries=host.retry.max_retries,
                silent_since_migration=(
                    self._migrations > 0 and attempt is not None and attempt.first_token_at is None
                ),
                resume_tokens=len(p.prompt_ids) + longest,
                max_prompt_tokens=p.model.max_prompt_tokens,
            )
        )
        if not self._granted(decision):  # spends the budget when it may
            return False
        again = decision.action == "retry"
        budget = host.retry_budget(model)
        # The failed worker's other streams fail with it (or are cut here): every open choice
        # moves. What they queued stays valid (each decoder holds exactly what was queued);
        # only the old attempt's retryable failures are dropped.
        await self._cancel_tasks()
        self._events.retain(lambda item: not isinstance(item, _Retry))
        if self._interrupt is not None:
            budget.refund()
            self._failure = self._interrupt.outcome
            raise self._refuse(self._interrupt)
        if any(isinstance(item, BaseException) for item in self._events):
            budget.refund()
            return False  # another choice failed for good: that error ends the request
        resume = [i for i in open_choices if self._ended_locally(i) is None]
        lease = None
        if resume:
            longest = max(len(self._produced.get(i, ())) for i in resume)
            try:
                lease = self._take_lease(len(resume), len(p.prompt_ids) + longest)
            except APIError:
                budget.refund()
                if again:
                    host.count_retry(model, "no_other_worker")
                else:
                    host.count_migration(model, "no_other_worker")
                return False
        else:
            budget.refund()  # every choice ended here: no worker was asked
        if again:
            self._retries += 1
            host.count_retry(model, "retried")
        else:
            self._migrations += 1
            self._migrated_from = retry.worker_id
            host.count_migration(model, "migrated")
        log.info(
            "request_retried" if again else "request_migrated",
            request_id=p.request_id,
            worker=retry.worker_id,
            to_worker=lease.worker_id if lease is not None else None,
            code=retry.error.code.name,
            error=retry.error.message,
            choices=open_choices,
            tokens=[len(self._produced.get(i, ())) for i in open_choices],
        )
        for index in open_choices:
            if lease is not None and index in resume:
                self._launch(index, lease, resume=True)
            else:
                self._finish_locally(index)
        return True

    def _ended_locally(self, index: int) -> str | None:
        """The finish reason of open choice `index` when no engine is needed to end it: its
        whole `max_new_tokens` came ("length"), or its last token is a stop token id
        ("stop"); the worker failed before its complete message."""
        produced = self._produced.get(index, [])
        if len(produced) >= self.prepared.max_new_tokens:
            return "length"
        if produced and produced[-1] in self._hidden_stop_ids:
            return "stop"
        return None

    def _finish_locally(self, index: int) -> None:
        """End open choice `index` as `_ended_locally` says: its decoder flushes what it
        held back, then its `ChoiceFinished`."""
        reason = self._ended_locally(index) or "stop"
        decoder = self._decoders[index]
        step = decoder.push(
            GenerateDone(
                token_ids=(),
                finish_reason=reason,
                prompt_tokens=len(self.prepared.prompt_ids),
                completion_tokens=decoder.completion_tokens,
                cached_tokens=decoder.cached_tokens,
                matched_stop=None,
            )
        )
        if isinstance(step, DetailedStep):
            if step.texts or step.logprobs:
                self._events.put(LogprobDelta(index, "".join(step.texts), step.logprobs))
        else:
            for text in step.texts:
                self._events.put(TextDelta(index, text))
        self._ended.add(index)
        self._events.put(ChoiceFinished(index, step.finish or reason))

    async def _cancel_tasks(self) -> None:
        try:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
        finally:
            if self._lease is not None:
                self._lease.release()
                self._lease = None

    async def _close(self) -> None:
        try:
            await self._cancel_tasks()
        finally:
            try:
                if self.host.quotas is not None:
                    routed = self.worker_id is not None
                    used = quota_tokens(self.finalize_usage(), routed=routed)
                    await self.host.quotas.settle(self._ticket, used, refund=not routed)
            finally:
                if self._untrack is not None:
                    self._untrack()
                self._log()

    # -- iteration --

    async def __aiter__(self) -> AsyncIterator[Event]:
        async for batch in self.batches():
            for event in batch:
                yield event

    def batches(self) -> AsyncIterator[list[Event]]:
        """The events in order, each batch holding every event that was ready at once (one
        write to the client): a batch is never held back waiting for the next."""
        # Not restartable, `_batches` yields no `_Restarted` (and no wrapping layer per batch).
        return cast(AsyncIterator[list[Event]], self._batches(restartable=False))

    async def _batches(self, *, restartable: bool) -> AsyncIterator[list[Event] | _Restarted]:
        """The events in order, in batches of those ready at once; with `restartable`
        (nothing has reached the client) a retryable failure routes the request again and
        yields `_Restarted`; without, a stream may migrate (`_migrate`) and go on. A
        failure ends the iteration with its `APIError`, after the events before it."""
        events = self._events
        while self._open_choices > 0:
            item = await events.get()
            if isinstance(item, _Retry):
                if restartable and self._may_retry():
                    await self._relaunch(item)
                    yield _Restarted()
                    continue
                if not restartable and await self._migrate(item):
                    continue
            if isinstance(item, BaseException):
                self._failure = self._failure_outcome(item)
                raise self._refuse(item)
            batch = [self._take(item)]
            while self._open_choices > 0:
                more = events.get_nowait()
                if more is None:
                    break
                if isinstance(more, BaseException):
                    events.push_front(more)  # raised by the next batch
                    break
                batch.append(self._take(more))
            yield batch

    @property
    def finished(self) -> bool:
        """Every choice has ended (its `ChoiceFinished` was taken)."""
        return self._open_choices == 0

    def _take(self, event: Event) -> Event:
        if isinstance(event, ChoiceFinished):
            self._open_choices -= 1
            self.finish_reasons[event.index] = event.reason
        return event

    # -- the choices' engine streams --

    async def _run_choice(
        self, index: int, lease: Lease, attempt: Attempt, *, resume: bool = False
    ) -> None:
        """Task body of choice `index`: its engine stream's events into the shared channel,
        then its `ChoiceFinished` or the failure (`EngineError`, `_Retry`, or an unexpected
        exception, which the client sees as a 500). With `resume` it goes on from the
        tokens the choice already produced (`_migrate`), with the same decoder."""
        p = self.prepared
        worker_id = lease.worker_id
        produced = self._produced.setdefault(index, [])
        decoder = self._decoders.get(index) if resume else None
        detailed = p.detailed  # logprobs or echo: a `DetailedDecoder` and `LogprobDelta`s
        if decoder is None:
            if detailed:
                decoder = DetailedDecoder(
                    p.model.tokenizer,
                    stop_set=p.stop_set,
                    hidden_stop_ids=self._hidden_stop_ids,
                    silent_ids=self._silent_ids,
                    skip_special_tokens=p.skip_special_tokens,
                    logprobs=p.logprobs,
                    echo=p.echo,
                )
            else:
                decoder = ChoiceDecoder(
                    p.model.tokenizer,
                    stop_set=p.stop_set,
                    hidden_stop_ids=self._hidden_stop_ids,
                    silent_ids=self._silent_ids,
                    skip_special_tokens=p.skip_special_tokens,
                )
            self._decoders[index] = decoder
        # A resumed stream's counts are its own; the choice's are the first attempt's
        # cached tokens and every token so far (`_rebased`).
        offset = len(produced) if resume else 0
        cached = decoder.cached_tokens
        params = GenerateParams(
            request_id=engine_request_id(self._engine_id, index, p.n),
            input_ids=(*p.prompt_ids, *produced) if resume else p.prompt_ids,
            max_new_tokens=p.max_new_tokens - offset,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            min_p=p.min_p,
            stop_token_ids=p.stop_token_ids,
            ignore_eos=p.ignore_eos,
            frequency_penalty=p.frequency_penalty,
            presence_penalty=p.presence_penalty,
            repetition_penalty=p.repetition_penalty,
            logit_bias=p.logit_bias,
            json_schema=p.json_schema,
            structural_tag=p.structural_tag,
            seed=choice_seed(p.seed, index),
            skip_special_tokens=p.skip_special_tokens,
            stream=self._engine_streams,
            return_logprob=p.logprobs,
            top_logprobs_num=p.top_logprobs,
            # echo: the prompt's entries from its first token (a resumed stream has them).
            logprob_start_len=0 if p.logprobs and p.echo is not None and not resume else -1,
            # Stop strings are matched here, so chunks of several tokens would count and
            # charge the tokens after a stop, and see it late.
            stream_interval=p.model.stream_interval() if p.stream and not p.stop_set else None,
        )
        # The whole request (admission wait included) stays within the timeout.
        waited_s = self._clock.now() - self._timeline.opened_at
        remaining_s = max(0.001, self.host.request_timeout_s - waited_s)
        trace = p.trace.header if p.trace is not None else None
        stream = lease.client.generate(params, timeout_s=remaining_s, traceparent=trace)
        try:
            events = self._events
            async for item in stream:
                if events.full():
                    await events.wait_for_room()
                attempt_cached = item.cached_tokens  # the worker's own, before `_rebased`
                if resume:
                    item = _rebased(item, offset, decoder.received - offset, cached)
                aborted = isinstance(item, GenerateDone) and item.finish_reason == "abort"
                if self._migrates:
                    new_ids = (
                        item.token_ids
                        if isinstance(item, TokenChunk)
                        else item.new_tokens(decoder.received)
                    )
                    produced.extend(new_ids)
                    if aborted:  # the stream may resume: the decoder keeps what it holds
                        item = _as_chunk(new_ids, item)
                step = decoder.push(item)
                now = self._clock.now()
                attempt.note(step.new_tokens, attempt_cached, now)
                if step.new_tokens:
                    self._timeline.tokens_at(now)
                if detailed:
                    assert isinstance(step, DetailedStep)
                    if step.texts or step.logprobs:
                        delta = LogprobDelta(index, "".join(step.texts), step.logprobs)
                        events.put(delta)
                else:
                    for text in step.texts:
                        events.put(TextDelta(index, text))
                if aborted or step.finish == "abort":
                    # The worker ended the request itself (flush, restart, its own limits).
                    raise EngineError(
                        code=grpc.StatusCode.ABORTED,
                        message="the worker aborted the request",
                        transport=False,
                    )
                if step.finish is not None:
                    self._ended.add(index)
                    events.put(ChoiceFinished(index, step.finish))
                    return
            # `generate` raises this itself; here it keeps a broken client from hanging us.
            raise EngineError(
                code=grpc.StatusCode.INTERNAL,
                message="worker stream ended without a complete message",
                transport=True,
            )
        except EngineError as err:
            failure = failover.classify(err.code.name, transport=err.transport)
            if failure.reported:
                p.model.report_failure(worker_id, err)
            if failure.refused:
                attempt.refused = True  # a full worker is no failing one: no error counted
            elif failure.retryable:
                attempt.failed = True  # its worker's failure, whatever the request does next
            self._events.put(_Retry(worker_id, err) if failure.retryable else err)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug of ours: surface it as a 500, never hang the client
            log.exception("choice_failed", request_id=p.request_id, worker=worker_id)
            self._events.put(err)
        finally:
            try:
                await stream.aclose()  # Abort unless it completed
            finally:
                self.engine_messages += stream.messages

    def _refuse(self, item: BaseException) -> APIError:
        """`_api_error(item)`, kept as the error the client got."""
        self._refusal = self._api_error(item)
        return self._refusal

    def _api_error(self, item: BaseException) -> APIError:
        """The error the client sees for what a choice task (or `interrupt`) queued."""
        if isinstance(item, _Retry):
            item = item.error
        if isinstance(item, _Interrupt):
            return item.error
        if isinstance(item, APIError):
            return item
        if isinstance(item, EngineError):
            return from_engine_error(item, constrained=self.prepared.constrained)
        return internal_error()

    def _failure_outcome(self, item: BaseException) -> str:
        """The log outcome of a request that ended with `item` from the channel."""
        if isinstance(item, _Interrupt):
            return item.outcome
        if isinstance(item, EngineError) and item.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "timeout"  # our own whole-request deadline (`request_timeout_s`)
        error = self._api_error(item)
        if isinstance(item, (_Retry, EngineError)) and (error.status >= 500 or error.status == 429):
            return "engine_error"  # the worker failed it, or had no room for it
        return "error" if error.status == 500 else f"error_{error.status}"

    # -- accounting --

    async def collect_texts(self) -> list[str]:
        """Every choice's whole text, in choice order (the non-streamed answer): the deltas
        joined once at the end (no string copied per token). A detailed request's reported
        tokens are in `logprobs` afterwards, per choice."""
        parts: list[list[str]] = [[] for _ in range(self.prepared.n)]
        logged: list[list[LoggedToken]] = [[] for _ in range(self.prepared.n)]
        async for batch in self._batches(restartable=not self.prepared.stream):
            if isinstance(batch, _Restarted):
                parts = [[] for _ in range(self.prepared.n)]
                logged = [[] for _ in range(self.prepared.n)]
                continue
            for event in batch:
                if isinstance(event, TextDelta):
                    parts[event.index].append(event.text)
                    if isinstance(event, LogprobDelta):
                        logged[event.index].extend(event.logprobs)
        self.logprobs = logged
        return ["".join(p) for p in parts]

    def finalize_usage(self) -> Usage:
        """The request's usage from the engines' counts (prompt once, completion summed)."""
        self.usage.completion_tokens = sum(d.completion_tokens for d in self._decoders.values())
        first = self._decoders.get(0)
        self.usage.cached_tokens = first.cached_tokens if first is not None else 0
        return self.usage

    @property
    def ttft_ms(self) -> float | None:
        """Time to first token in ms, from the request's arrival to the first token of any
        choice (`accounting.Timeline.ttft_ms`)."""
        return self._timeline.ttft_ms(self.prepared.arrived_at, streamed=self._engine_streams)

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first, in ms (`accounting.Timeline.tpot_ms`)."""
        tokens = sum(d.completion_tokens for d in self._decoders.values())
        return self._timeline.tpot_ms(tokens, self.prepared.n, streamed=self._engine_streams)

    def _log(self) -> None:
        fields: dict[str, object] = {
            "engine_messages": self.engine_messages,
            "engine_request_id": self._engine_id if self.worker_id else None,
        }
        if self._migrated_from is not None:
            fields["migrated_from"] = self._migrated_from
        if self._route is not None:
            fields["route"] = self._route
        ended = Outcome(
            outcome=self.outcome,
            refusal=self._refusal,
            finish_reasons=self.finish_reasons,
            worker_id=self.worker_id or "",
            version=self.version,
            streamed=self._engine_streams,
            fields=fields,
        )
        record = request_record(
            self.prepared,
            ended,
            self.finalize_usage(),
            self._timeline,
            self._attempt,
            now=self._clock.now(),
        )
        self.slo = self.host.recorder.done(record)


def _route_fields(decision: RouteDecision, at: float) -> dict[str, object]:
    """The request log's `route` object: the first decision's chosen worker and branch, the
    prompt tokens the index credited to that worker and to its best holder (`RouteDecision`),
    and when it was taken (`at`, Unix seconds)."""
    return {
        "worker": decision.worker_id,
        "branch": decision.branch,
        "matched_tokens": decision.matched_tokens,
        "best_worker": decision.best_worker_id,
        "best_tokens": decision.best_tokens,
        "at": round(at, 6),
    }


def _rebased(
    item: TokenChunk | GenerateDone, offset: int, received: int, cached: int
) -> TokenChunk | GenerateDone:
    """A resumed stream's message as the choice's decoder must see it: `offset` tokens came
    before this stream, which has given `received`; cached tokens are the first attempt's
    `cached`. A `GenerateDone` carries exactly its missing tail, its count the choice's."""
    if isinstance(item, TokenChunk):
        return replace(item, cached_tokens=cached)
    tail = item.new_tokens(received)
    return replace(
        item,
        token_ids=tail,
        completion_tokens=offset + max(item.completion_tokens, received + len(tail)),
        cached_tokens=cached,
    )


def _as_chunk(token_ids: tuple[int, ...], done: GenerateDone) -> TokenChunk:
    """`token_ids` of an aborted stream's last message as a chunk (no flush of the
    decoder's held-back text: the choice may go on elsewhere)."""
    return TokenChunk(
        token_ids=token_ids,
        prompt_tokens=done.prompt_tokens,
        completion_tokens=done.completion_tokens,
        cached_tokens=done.cached_tokens,
    )


def _outcome_of(err: BaseException) -> str:
    # A cancelled call or a client gone cancels the handler; a generator closed early
    # (an iterator over a Generation) sees GeneratorExit.
    if isinstance(err, (asyncio.CancelledError, GeneratorExit)):
        return "client_closed"
    if isinstance(err, APIError):
        return f"error_{err.status}"
    if isinstance(err, ConnectionError):
        return "client_closed"
    return "error"


def engine_request_id(base: str, index: int, n: int) -> str:
    """The engine's request id of choice `index` of `n`: `base-` and the index zero-padded to
    the width of `n - 1`, so no sibling's id is a prefix of another's (SGLang's Abort
    aborts every request whose id starts with the given one)."""
    return f"{base}-{index:0{len(str(n - 1))}d}"


def choice_seed(seed: int | None, index: int) -> int | None:
    """The engine seed of choice `index` of a seeded request: `seed + index`, wrapped into
    the signed 64-bit range, so the `n` choices differ and the request as a whole repeats."""
    if seed is None:
        return None
    return (seed + index + 2**63) % 2**64 - 2**63
