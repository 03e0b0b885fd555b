"""SGLang gRPC engine client: one `grpc.aio` channel per worker, plain dataclasses out.

Rule of this file: every RPC error leaves as `EngineError`, every Generate that does not
end with its `complete` message is aborted on the worker (`Abort(request_id)`), and nothing
protobuf-shaped escapes `generate` (discovery calls return the messages as they are).
`SamplingParams` is always filled explicitly: proto3 zero defaults are not SGLang's
semantic defaults (temperature 1, top_p 1, top_k -1, repetition_penalty 1).
Protocol: `sglang.grpc.scheduler.SglangScheduler` from smg-grpc-proto 0.4.28.

Log probabilities, as SGLang 0.5.23's servicer sends them (measured on a real worker):
- output logprobs: per generated token its id, its logprob and, with `top_logprobs_num` > 0,
  the top entries (id, logprob) in descending order (at temperature 0 the sampled token is the
  first). Streaming: each chunk carries its own tokens' entries, and the `complete` repeats the
  last chunk's (as its `output_ids` repeat the last chunk's tokens; `GenerateDone.new_logprobs`
  takes the tail not yet received). Not streaming: the `complete` carries all of them.
- prompt logprobs (`logprob_start_len` >= 0): one entry per prompt token from that position
  on; the first entry of the range has no value (None) and no top entries, whatever the
  position. Streaming: in the first chunk only (and in the `complete` as well when that chunk
  was the last); not streaming: in the `complete`. `logprob_start_len` = prompt length gives
  none, more is refused by the worker (INVALID_ARGUMENT). SGLang limits the radix-cache match
  to `logprob_start_len` tokens (page-aligned down), so such a request's `cached_tokens` drop.
- A `logprob_start_len` below -1 or a `top_logprobs_num` above the vocabulary kill SGLang
  0.5.23's scheduler (an assertion, the whole worker exits): `build_generate_request` refuses
  a negative `top_logprobs_num` or a `logprob_start_len` < -1; bounding `top_logprobs_num` (the
  OpenAI API's 20) is the gateway's job.
- No per-chunk work is added when logprobs are off: `convert_response` reads the logprob and
  reasoning fields of a chunk only when asked to (`detail`), and `TokenChunk`'s extra fields
  are class-level defaults unless given.

`seed`: SGLang's SamplingParams has no seed field; it travels in `custom_params` as
{"seed": N} (a protobuf Struct number, exact up to 2**53). SGLang 0.5.23 accepts and ignores
that key (measured: same seed, different answers; no error); the simulated worker honours it.
`require_reasoning`: SGLang counts `reasoning_tokens` (output tokens up to and including the
think-end token, cumulative on chunks and complete) only for such requests and only on a worker
launched with `--reasoning-parser`; otherwise the field stays 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import grpc
import grpc.aio
import structlog
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

#: Status codes that mean the worker (or the path to it) failed, not the request: they
#: count toward health. DEADLINE_EXCEEDED and INTERNAL follow SGLang's servicer mapping
#: (408/504 and 5xx); UNKNOWN is what grpc reports when a handler raises; DATA_LOSS is a
#: broken stream.
TRANSPORT_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
    }
)

#: Channel options: keepalive every 30 s while calls are open (grpc's default of at most
#: 2 pings without data keeps us under servers' default ping-strike limit), 20 s to answer;
#: 64 MiB
#: messages both ways (a 128k-token prompt is ~0.6 MB; tokenizer zips come chunked);
#: reconnect backoff 0.2 s .. 2 s so a restarted worker is found again within ~2 s
#: (grpc's default max backoff is 120 s).
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)

#: Seconds an Abort RPC may take before we give up on it (best effort).
ABORT_TIMEOUT_S = 2.0

#: SubscribeKvEvents' method path, from the package's service descriptor (the generated
#: stub's path): called without a response deserializer, so batches arrive as wire bytes.
SUBSCRIBE_KV_EVENTS_PATH = (
    f"/{pb.DESCRIPTOR.services_by_name['SglangScheduler'].full_name}/SubscribeKvEvents"
)


class EngineError(Exception):
    """A failed engine RPC.

    `code`: the gRPC status code. `message`: the worker's (or grpc's) detail.
    `transport`: True when the worker or the connection is at fault (UNAVAILABLE,
    DEADLINE_EXCEEDED, INTERNAL, UNKNOWN, DATA_LOSS, a stream cut short): it counts toward
    the worker's health. False for the request's own faults (INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED, ...), which never mark a worker.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        transport: bool | None = None,
        worker_id: str = "",
    ) -> None:
        self.code = code
        self.message = message
        self.transport = code in TRANSPORT_CODES if transport is None else transport
        self.worker_id = worker_id
        where = f" from {worker_id}" if worker_id else ""
        super().__init__(f"{code.name}{where}: {message}")

    @classmethod
    def from_rpc(cls, err: grpc.aio.AioRpcError, *, worker_id: str = "") -> EngineError:
        """Classify a grpc error (see `TRANSPORT_CODES`)."""
        return cls(err.code(), err.details() or "", worker_id=worker_id)


@dataclass(frozen=True)
class GenerateParams:
    """One generation request as the gateway hands it over.

    `input_ids`: prompt token ids. `max_new_tokens`: completion budget (tokens).
    `temperature` (0 = greedy), `top_p` in (0, 1], `top_k` (-1 = off): SGLang semantics.
    `stop_token_ids`: single-token stops (string stops are matched in the gateway).
    `frequency_penalty`/`presence_penalty` in [-2, 2] (OpenAI semantics, 0 = off);
    `min_p` in [0, 1] (0 = off), `repetition_penalty` in (0, 2] (1 = off): SGLang semantics.
    `logit_bias`: token id -> bias added to its logit, in [-100, 100] (sent as SGLang's map of
    decimal id strings). `json_schema`: JSON schema text decoding is constrained to (SGLang's
    `json_schema` constraint), None for none. `structural_tag`: SGLang's structural-tag JSON
    text (`{"type": "structural_tag", "structures": [...], "triggers": [...]}` or
    `{"type": "structural_tag", "format": {...}}`), None for none; at most one of the two.
    `seed`: sampling seed, sent as `custom_params` {"seed": N} (see the module docstring), None
    for none. `stream`: chunks as they are generated (False: only the complete message,
    carrying every token). `stream_interval`: tokens per streamed chunk (SGLang's per-request
    `SamplingParams.stream_interval`; the first token is still sent at once), None for the
    worker's `--stream-interval`.
    `return_logprob`: answer with log probabilities (`TokenChunk.logprobs`,
    `GenerateDone.logprobs`); `top_logprobs_num` >= 0: top entries per position;
    `logprob_start_len`: first prompt position with prompt logprobs, -1 for none (both only with
    `return_logprob`). `require_reasoning`: ask the worker to count `reasoning_tokens`.
    """

    request_id: str
    input_ids: Sequence[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    stream: bool = True
    skip_special_tokens: bool = True
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    json_schema: str | None = None
    stream_interval: int | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    structural_tag: str | None = None
    seed: int | None = None
    require_reasoning: bool = False


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log probability: `token_id`, its `logprob` (<= 0) and `top`, the
    position's top (token id, logprob) entries in descending order (empty unless
    `top_logprobs_num` > 0)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class PromptTokenLogprob:
    """One prompt token's log probability given the tokens before it: `logprob` is None for
    the first token of the requested range (SGLang computes none there), `top` as in
    `TokenLogprob` (empty where `logprob` is None)."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


NO_LOGPROBS: tuple[TokenLogprob, ...] = ()
NO_PROMPT_LOGPROBS: tuple[PromptTokenLogprob, ...] = ()


@dataclass(frozen=True, init=False)
class TokenChunk:
    """Newly generated tokens; counts are cumulative for the request (tokens).

    `reasoning_tokens`: the worker's cumulative count of reasoning tokens (0 unless the request
    set `require_reasoning` on a worker that counts them). `logprobs`: one entry per token of
    `token_ids` when the request asked for them, else empty. `prompt_logprobs`: the prompt's
    entries (from `logprob_start_len`), on the first chunk of a stream only.

    The three optional fields are class-level defaults that `__init__` leaves alone unless
    given, so a plain chunk costs what a four-field one does (a per-token object).
    """

    token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = NO_LOGPROBS
    prompt_logprobs: tuple[PromptTokenLogprob, ...] = NO_PROMPT_LOGPROBS

    def __init__(
        self,
        token_ids: tuple[int, ...],
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        reasoning_tokens: int = 0,
        logprobs: tuple[TokenLogprob, ...] = NO_LOGPROBS,
        prompt_logprobs: tuple[PromptTokenLogprob, ...] = NO_PROMPT_LOGPROBS,
    ) -> None:
        setattr_ = object.__setattr__
        setattr_(self, "token_ids", token_ids)
        setattr_(self, "prompt_tokens", prompt_tokens)
        setattr_(self, "completion_tokens", completion_tokens)
        setattr_(self, "cached_tokens", cached_tokens)
        if reasoning_tokens:
            setattr_(self, "reasoning_tokens", reasoning_tokens)
        if logprobs:
            setattr_(self, "logprobs", logprobs)
        if prompt_logprobs:
            setattr_(self, "prompt_logprobs", prompt_logprobs)


@dataclass(frozen=True)
class GenerateDone:
    """The end of a generation.

    `token_ids`: the tokens the complete message carries (`output_ids`): when not
    streaming all of them; when streaming, SGLang 0.5.x repeats the last chunk's tokens here
    and older servicers sent the final step's tokens only here, so take them through
    `new_tokens`. `completion_tokens`: the engine's count of generated tokens.
    `finish_reason`: "stop" | "length" | "abort". `matched_stop`: the stop token id or stop
    string the engine matched, else None. `reasoning_tokens`: the worker's count of reasoning
    tokens (see `TokenChunk`). `logprobs`: one entry per token of `token_ids` when the request
    asked for them (so, streaming, the last chunk's again: take them through
    `new_logprobs`). `prompt_logprobs`: the prompt's entries, when not streaming (streaming:
    only when the first chunk was also the last, a repeat of that chunk's).
    """

    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    matched_stop: int | str | None
    reasoning_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = NO_LOGPROBS
    prompt_logprobs: tuple[PromptTokenLogprob, ...] = NO_PROMPT_LOGPROBS

    def new_tokens(self, received: int) -> tuple[int, ...]:
        """The tokens of `token_ids` not yet received, given `received` tokens from chunks.

        The rule: a choice's tokens are those of its chunks; `output_ids` adds only the tail
        that `completion_tokens` says is missing (none when the chunks carried them all; all
        of `output_ids` when no chunk came). A servicer that leaves `completion_tokens` at 0
        is taken at its `output_ids` when nothing was streamed, else adds nothing.
        """
        if self.completion_tokens <= 0:
            return self.token_ids if received == 0 else ()
        missing = min(self.completion_tokens - received, len(self.token_ids))
        return self.token_ids[len(self.token_ids) - missing :] if missing > 0 else ()

    def new_logprobs(self, received: int) -> tuple[TokenLogprob, ...]:
        """The entries of `logprobs` for the tokens `new_tokens(received)` gives (the same
        rule: `logprobs` align with `token_ids`)."""
        if not self.logprobs:
            return NO_LOGPROBS
        count = len(self.new_tokens(received))
        return self.logprobs[len(self.logprobs) - count :] if count else NO_LOGPROBS


def build_sampling_params(params: GenerateParams) -> pb.SamplingParams:
    """Every field with its semantic default set explicitly (proto3 zeros are wrong)."""
    sampling = pb.SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
        repetition_penalty=params.repetition_penalty,
        max_new_tokens=params.max_new_tokens,
        stop_token_ids=list(params.stop_token_ids),
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=True,
        n=1,
        min_new_tokens=0,
        ignore_eos=params.ignore_eos,
        no_stop_trim=False,
    )
    for token_id, bias in params.logit_bias.items():
        sampling.logit_bias[str(token_id)] = bias
    if params.json_schema is not None and params.structural_tag is not None:
        raise ValueError("json_schema and structural_tag are exclusive (one constraint)")
    if params.json_schema is not None:
        sampling.json_schema = params.json_schema
    elif params.structural_tag is not None:
        sampling.structural_tag = params.structural_tag
    if params.stream_interval is not None:
        sampling.stream_interval = params.stream_interval
    if params.seed is not None:
        sampling.custom_params.update({"seed": params.seed})
    return sampling


def build_generate_request(params: GenerateParams) -> pb.GenerateRequest:
    """The wire request for `params` (tokenized input, explicit sampling, logprob options).

    Raises ValueError for a `logprob_start_len` below -1 or a negative `top_logprobs_num`
    (SGLang 0.5.23's scheduler dies on the first), and for both constraints at once.
    """
    if params.return_logprob:
        if params.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be >= -1, got {params.logprob_start_len}")
        if params.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be >= 0, got {params.top_logprobs_num}")
        return pb.GenerateRequest(
            request_id=params.request_id,
            tokenized=pb.TokenizedInput(input_ids=list(params.input_ids)),
            sampling_params=build_sampling_params(params),
            return_logprob=True,
            logprob_start_len=params.logprob_start_len,
            top_logprobs_num=params.top_logprobs_num,
            stream=params.stream,
            require_reasoning=params.require_reasoning,
        )
    return pb.GenerateRequest(
        request_id=params.request_id,
        tokenized=pb.TokenizedInput(input_ids=list(params.input_ids)),
        sampling_params=build_sampling_params(params),
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        stream=params.stream,
        require_reasoning=params.require_reasoning,
    )


def _top(entry: pb.TopLogProbs) -> tuple[tuple[int, float], ...]:
    return tuple(zip(entry.token_ids, entry.values, strict=False))


def convert_output_logprobs(lp: pb.OutputLogProbs) -> tuple[TokenLogprob, ...]:
    """`OutputLogProbs` as one `TokenLogprob` per token (a top row without a token, as a
    prefill-only request gets, is dropped)."""
    ids, values, tops = lp.token_ids, lp.token_logprobs, lp.top_logprobs
    if not tops:
        return tuple(TokenLogprob(t, v) for t, v in zip(ids, values, strict=False))
    return tuple(
        TokenLogprob(t, v, _top(top)) for t, v, top in zip(ids, values, tops, strict=False)
    )


def convert_input_logprobs(lp: pb.InputLogProbs) -> tuple[PromptTokenLogprob, ...]:
    """`InputLogProbs` as one `PromptTokenLogprob` per prompt token of the range (None where
    the worker sent no value)."""
    tops = lp.top_logprobs
    entries = []
    for i, (token_id, value) in enumerate(zip(lp.token_ids, lp.token_logprobs, strict=False)):
        logprob = value.value if value.HasField("value") else None
        top = _top(tops[i]) if i < len(tops) else ()
        entries.append(PromptTokenLogprob(token_id, logprob, top))
    return tuple(entries)


def convert_response(
    resp: pb.GenerateResponse, detail: bool = False
) -> TokenChunk | GenerateDone | None:
    """A wire response as plain data; None for a response with neither chunk nor complete.

    `detail`: also read a chunk's logprobs and reasoning count (a request that asked for
    either); without it a chunk's are left unread (the per-token path stays as it was). A
    complete's are always read.
    """
    kind = resp.WhichOneof("response")
    if kind == "chunk":
        c = resp.chunk
        if not detail:
            return TokenChunk(
                tuple(c.token_ids), c.prompt_tokens, c.completion_tokens, c.cached_tokens
            )
        return TokenChunk(
            tuple(c.token_ids),
            c.prompt_tokens,
            c.completion_tokens,
            c.cached_tokens,
            c.reasoning_tokens,
            convert_output_logprobs(c.output_logprobs)
            if c.HasField("output_logprobs")
            else NO_LOGPROBS,
            convert_input_logprobs(c.input_logprobs)
            if c.HasField("input_logprobs")
            else NO_PROMPT_LOGPROBS,
        )
    if kind == "complete":
        d = resp.complete
        stop_kind = d.WhichOneof("matched_stop")
        matched: int | str | None
        if stop_kind == "matched_token_id":
            matched = d.matched_token_id
        elif stop_kind == "matched_stop_str":
            matched = d.matched_stop_str
        else:
            matched = None
        return GenerateDone(
            token_ids=tuple(d.output_ids),
            finish_reason=d.finish_reason,
            prompt_tokens=d.prompt_tokens,
            completion_tokens=d.completion_tokens,
            cached_tokens=d.cached_tokens,
            matched_stop=matched,
            reasoning_tokens=d.reasoning_tokens,
            logprobs=convert_output_logprobs(d.output_logprobs)
            if d.HasField("output_logprobs")
            else NO_LOGPROBS,
            prompt_logprobs=convert_input_logprobs(d.input_logprobs)
            if d.HasField("input_logprobs")
            else NO_PROMPT_LOGPROBS,
        )
    return None


class StreamWatcher(Protocol):
    """Told how one Generate stream goes (`EngineClient.generate(watcher=...)`); each
    method is called synchronously from the consumer's `__anext__`, at most once."""

    def answered(self) -> None:
        """The worker answered: the first `TokenChunk` with a token, or a `GenerateDone`
        that is not an abort before any, arrived (an aborted request's empty chunk is no
        answer)."""
        ...

    def completed(self) -> None:
        """The stream ended with its `GenerateDone`, not an abort."""
        ...

    def failed(self, err: EngineError) -> None:
        """The stream failed with `err` (the `EngineError` the consumer gets next)."""
        ...


class EngineStream:
    """One Generate call's messages as plain data: an async iterator of `TokenChunk`s and
    exactly one `GenerateDone`, then StopAsyncIteration.

    On every end before the `GenerateDone` (`aclose`, the consumer cancelled, the
    deadline, an RPC error, a stream that ends without `complete`) the call is cancelled and
    `Abort(request_id)` is sent once; after a normal end nothing is sent. Raises
    `EngineError` for RPC failures. A stream cut by `EngineClient.sever` raises the
    sever's `EngineError` (UNAVAILABLE, transport) at once, whether the consumer was
    waiting on it or calls it next; its Abort goes in the background, not awaited (the
    worker may not answer). A consumer that stops before the end must call `aclose`
    (dropping the stream does not abort the call).
    `messages`: responses received so far (what the stream cost the gateway: one gRPC
    message each).
    """

    __slots__ = (
        "__weakref__",
        "_answered",
        "_call",
        "_client",
        "_detail",
        "_done",
        "_ended",
        "_responses",
        "_severed",
        "_watcher",
        "messages",
        "request_id",
    )

    def __init__(
        self,
        client: EngineClient,
        call: Any,
        request_id: str,
        watcher: StreamWatcher | None = None,
        detail: bool = False,
    ) -> None:
        self._client = client
        self._call = call
        self._detail = detail  # read chunks' logprobs and reasoning counts
        # The call's own response iterator (grpc.aio's async-for path), not `call.read()`.
        self._responses = call.__aiter__()
        self.request_id = request_id
        self._watcher = watcher
        self._answered = False  # the watcher was told `answered`
        self._done = False  # the GenerateDone was returned
        self._ended = False  # nothing more will be read (done, aborted or failed)
        self._severed: EngineError | None = None  # set by `sever`
        self.messages = 0

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> TokenChunk | GenerateDone:
        if self._ended:
            raise StopAsyncIteration
        if self._severed is not None:
            raise self._fail_severed()
        try:
            while True:
                try:
                    resp = await self._responses.__anext__()
                except StopAsyncIteration:
                    if self._severed is not None:
                        raise self._fail_severed() from None
                    await self._end("stream ended without complete")
                    raise self._failed(
                        EngineError(
                            grpc.StatusCode.INTERNAL,
                            f"Generate stream for {self.request_id} ended without a complete "
                            "message",
                            transport=True,
                            worker_id=self._client.worker_id,
                        )
                    ) from None
                self.messages += 1
                item = convert_response(resp, self._detail)
                if item is None:
                    continue
                if isinstance(item, GenerateDone):
                    self._done = self._ended = True
                    self._client._streams.discard(self)
                    if self._watcher is not None and item.finish_reason != "abort":
                        if not self._answered:
                            self._answered = True
                            self._watcher.answered()
                        self._watcher.completed()
                elif item.token_ids and not self._answered and self._watcher is not None:
                    self._answered = True
                    self._watcher.answered()
                return item
        except grpc.aio.AioRpcError as err:
            if self._severed is not None:
                raise self._fail_severed() from err
            await self._end(f"rpc error {err.code().name}")
            raise self._failed(self._client._error(err)) from err
        except asyncio.CancelledError:
            task = asyncio.current_task()
            # grpc.aio raises CancelledError in the reader of a call cancelled locally: when
            # `sever` did that and nobody cancelled this task, it is the sever's error.
            if self._severed is not None and task is not None and task.cancelling() == 0:
                raise self._fail_severed() from None
            await self._end("cancelled")
            raise

    async def aclose(self) -> None:
        """Stop reading; sends Abort unless the stream completed. Idempotent."""
        await self._end("client closed the stream")

    def sever(self, err: EngineError) -> bool:
        """Cut the call now: the consumer's pending or next `__anext__` raises `err`.
        False (nothing done) when the stream already ended."""
        if self._ended or self._severed is not None:
            return False
        self._severed = err
        self._call.cancel()
        return True

    def _fail_severed(self) -> EngineError:
        """End a severed stream (Abort in the background) and return its error."""
        err = self._severed
        assert err is not None
        if not self._ended:
            self._ended = True
            self._client._streams.discard(self)
            self._client._abort_detached(self.request_id, f"severed: {err.message}")
            self._failed(err)
        return err

    def _failed(self, err: EngineError) -> EngineError:
        if self._watcher is not None:
            self._watcher.failed(err)
        return err

    async def _end(self, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._client._streams.discard(self)
        self._call.cancel()
        if not self._done:
            await self._client._abort_in_background(self.request_id, reason)


@dataclass(frozen=True)
class HealthProbe:
    """One HealthCheck's outcome: `healthy` (answered healthy=true), `timed_out` (no answer
    within the timeout), `message` (the worker's or grpc's)."""

    healthy: bool
    timed_out: bool = False
    message: str = ""


@runtime_checkable
class EngineStreamApi(Protocol):
    """What the gateway reads from one Generate stream (`EngineStream` and
    `homing.engines.testing.FakeStream` are ones): an async iterator of `TokenChunk`s then one
    `GenerateDone`; `EngineError` on failure; `aclose` ends it (Abort unless it completed);
    `sever` cuts it with an error; `messages`: messages received so far."""

    request_id: str
    messages: int

    def __aiter__(self) -> EngineStreamApi:
        """The stream itself."""
        ...

    async def __anext__(self) -> TokenChunk | GenerateDone:
        """The next message; StopAsyncIteration after the `GenerateDone`."""
        ...

    async def aclose(self) -> None:
        """Stop reading; Abort unless the stream completed. Idempotent."""
        ...

    def sever(self, err: EngineError) -> bool:
        """Cut the stream: the consumer's pending or next read raises `err`. False when it
        already ended."""
        ...


@runtime_checkable
class EngineApi(Protocol):
    """The surface of one worker's client that the pool (`homing.engines.pool.WorkerPool`),
    the outlier ejector and a lease (`homing.fleet.dispatch.LeaseClient`) use; `EngineClient`
    and `homing.engines.testing.FakeEngine` satisfy it. Each method behaves as
    `EngineClient`'s of the same name."""

    url: str
    worker_id: str

    @property
    def open_streams(self) -> int:
        """Generate streams started and not yet ended."""
        ...

    def sever(self, reason: str) -> int:
        """Cut every open Generate stream with UNAVAILABLE (transport); how many were cut."""
        ...

    def generate(
        self,
        params: GenerateParams,
        *,
        timeout_s: float | None = None,
        traceparent: str | None = None,
        watcher: StreamWatcher | None = None,
    ) -> EngineStreamApi:
        """Start a Generate call."""
        ...

    async def abort(self, request_id: str, reason: str = "") -> None:
        """Best-effort Abort; never raises."""
        ...

    async def health_check(self, timeout_s: float = 2.0) -> bool:
        """Answered healthy within `timeout_s`; never raises."""
        ...

    async def health_probe(self, timeout_s: float = 2.0) -> HealthProbe:
        """One HealthCheck's outcome; never raises."""
        ...

    async def model_info(self, timeout_s: float = 10.0) -> pb.GetModelInfoResponse:
        """GetModelInfo; `EngineError` on failure."""
        ...

    async def server_info(self, timeout_s: float = 10.0) -> pb.GetServerInfoResponse:
        """GetServerInfo; `EngineError` on failure."""
        ...

    async def tokenizer_bundle(self, timeout_s: float = 60.0) -> bytes:
        """GetTokenizer's zip, checked against its sha256; `EngineError` on failure."""
        ...

    def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[bytes]:
        """SubscribeKvEvents: each `KvEventBatch` as bytes until the worker ends the stream;
        `EngineError` on failure."""
        ...

    async def close(self) -> None:
        """Wait for pending aborts, then release the connection."""
        ...


def grpc_target(url: str) -> str:
    """`grpc://host:port` (or bare `host:port`) -> `host:port`; ValueError otherwise."""
    target = url.removeprefix("grpc://")
    if "://" in target or ":" not in target:
        raise ValueError(f"engine url must look like grpc://host:port, got {url!r}")
    return target


class EngineClient:
    """Client of one SGLang (or simulated) worker at `url` ("grpc://host:port").

    The channel is created on first use, inside the running event loop, and lives until
    `close()`. All methods raise `EngineError` on RPC failure unless they say otherwise.
    """

    def __init__(
        self,
        url: str,
        *,
        worker_id: str,
        channel_options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
    ) -> None:
        self.url = url
        self.worker_id = worker_id
        self.target = grpc_target(url)
        self._options = list(channel_options)
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SglangSchedulerStub | None = None
        self._background: set[asyncio.Task[None]] = set()
        # Open Generate streams, for `sever` (weak: a stream dropped unread is let go).
        self._streams: weakref.WeakSet[EngineStream] = weakref.WeakSet()

    @property
    def open_streams(self) -> int:
        """Generate streams started and not yet ended."""
        return len(self._streams)

    def sever(self, reason: str) -> int:
        """Cut every open Generate stream now (the worker stopped answering): each one's
        consumer gets `EngineError(UNAVAILABLE, reason, transport=True)` at once instead of
        waiting for the channel's keepalive. Returns how many were cut."""
        return sum(
            stream.sever(
                EngineError(
                    grpc.StatusCode.UNAVAILABLE, reason, transport=True, worker_id=self.worker_id
                )
            )
            for stream in list(self._streams)
        )

    def _get_stub(self) -> pb_grpc.SglangSchedulerStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._stub = pb_grpc.SglangSchedulerStub(self._channel)
        return self._stub

    def _error(self, err: grpc.aio.AioRpcError) -> EngineError:
        return EngineError.from_rpc(err, worker_id=self.worker_id)

    def generate(
        self,
        params: GenerateParams,
        *,
        timeout_s: float | None = None,
        traceparent: str | None = None,
        watcher: StreamWatcher | None = None,
    ) -> EngineStream:
        """Start a Generate call: an `EngineStream` of `TokenChunk`s then one `GenerateDone`.

        `timeout_s`: deadline for the whole generation (None: none); past it the stream
        fails with EngineError(DEADLINE_EXCEEDED, transport=True). `traceparent`: a W3C
        trace context sent as the call's `traceparent` metadata. `watcher`: told when the
        worker answers, completes or fails the stream (`StreamWatcher`).
        """
        metadata = (("traceparent", traceparent),) if traceparent else None
        call = self._get_stub().Generate(
            build_generate_request(params), timeout=timeout_s, metadata=metadata
        )
        stream = EngineStream(
            self,
            call,
            params.request_id,
            watcher,
            detail=params.return_logprob or params.require_reasoning,
        )
        self._streams.add(stream)
        return stream

    async def _abort_in_background(self, request_id: str, reason: str) -> None:
        """Send Abort from a task of its own, so a second cancellation cannot lose it."""
        await asyncio.shield(self._abort_detached(request_id, reason))

    def _abort_detached(self, request_id: str, reason: str) -> asyncio.Task[None]:
        """Send Abort from a task of its own (`close` waits for it); not awaited here."""
        task = asyncio.ensure_future(self.abort(request_id, reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def abort(self, request_id: str, reason: str = "") -> None:
        """Best-effort `Abort(request_id)`; logs and swallows failures (never raises)."""
        try:
            await self._get_stub().Abort(
                pb.AbortRequest(request_id=request_id, reason=reason), timeout=ABORT_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as err:
            log.debug(
                "engine_abort_failed",
                worker=self.worker_id,
                request_id=request_id,
                code=err.code().name,
            )

    async def health_check(self, timeout_s: float = 2.0) -> bool:
        """True when the worker answers HealthCheck with healthy=true within `timeout_s`.

        Never raises: any RPC failure is False.
        """
        return (await self.health_probe(timeout_s)).healthy

    async def health_probe(self, timeout_s: float = 2.0) -> HealthProbe:
        """One HealthCheck: whether it answered healthy within `timeout_s`, and whether it
        failed by running out of time (DEADLINE_EXCEEDED) rather than by an answer or a
        refused connection. Never raises."""
        try:
            resp = await self._get_stub().HealthCheck(pb.HealthCheckRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            timed_out = err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            return HealthProbe(False, timed_out=timed_out, message=err.details() or "")
        return HealthProbe(bool(resp.healthy), message=resp.message)

    async def model_info(self, timeout_s: float = 10.0) -> pb.GetModelInfoResponse:
        """GetModelInfo (served model name, context length, eos ids, ...)."""
        try:
            return await self._get_stub().GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err

    async def server_info(self, timeout_s: float = 10.0) -> pb.GetServerInfoResponse:
        """GetServerInfo (server_args Struct: page_size, max_running_requests, ...)."""
        try:
            return await self._get_stub().GetServerInfo(
                pb.GetServerInfoRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err

    async def tokenizer_bundle(self, timeout_s: float = 60.0) -> bytes:
        """GetTokenizer's zip: the chunks joined, checked against the last chunk's sha256.

        Raises EngineError(DATA_LOSS, transport=False) when the digest is missing or does
        not match the bytes received.
        """
        parts: list[bytes] = []
        digest = ""
        try:
            async for chunk in self._get_stub().GetTokenizer(
                common_pb2.GetTokenizerRequest(), timeout=timeout_s
            ):
                parts.append(chunk.data)
                if chunk.sha256:
                    digest = chunk.sha256
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err
        data = b"".join(parts)
        actual = hashlib.sha256(data).hexdigest()
        if not digest or digest.lower() != actual:
            raise EngineError(
                grpc.StatusCode.DATA_LOSS,
                f"tokenizer bundle sha256 mismatch: worker says {digest or '(none)'}, "
                f"received {len(data)} bytes hashing to {actual}",
                transport=False,
                worker_id=self.worker_id,
            )
        return data

    async def loads(self, timeout_s: float = 5.0) -> pb.GetLoadsResponse:
        """GetLoads (per-rank running/waiting/token_usage), all sections."""
        try:
            return await self._get_stub().GetLoads(
                pb.GetLoadsRequest(include=["all"]), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err

    async def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[bytes]:
        """SubscribeKvEvents(start_sequence_number, load_records_before_first_batch=True).

        Yields each `KvEventBatch` as the serialized bytes the stream delivered (not
        parsed: the router reads them, `homing.router.events.decode_batch`) until the
        worker ends the stream; raises EngineError on failure. Closing the iterator cancels
        the call.
        """
        self._get_stub()
        assert self._channel is not None
        subscribe = self._channel.unary_stream(
            SUBSCRIBE_KV_EVENTS_PATH,
            request_serializer=common_pb2.SubscribeKvEventsRequest.SerializeToString,
            response_deserializer=None,
        )
        call = subscribe(
            common_pb2.SubscribeKvEventsRequest(
                start_sequence_number=start_sequence_number,
                load_records_before_first_batch=True,
            )
        )
        try:
            async for data in call:
                yield data
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err
        finally:
            call.cancel()

    async def flush_cache(self, timeout_s: float = 0.0) -> bool:
        """FlushCache; `timeout_s` is how long the worker may wait to go idle (0: now)."""
        try:
            resp = await self._get_stub().FlushCache(
                common_pb2.FlushCacheRequest(timeout_s=timeout_s), timeout=timeout_s + 10.0
            )
        except grpc.aio.AioRpcError as err:
            raise self._error(err) from err
        return bool(resp.success)

    async def close(self) -> None:
        """Wait for pending aborts (up to their own timeout), then close the channel."""
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None
