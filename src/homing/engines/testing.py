"""Test doubles for code that drives engine workers. Nothing here is used by the running
gateway.

- `FakeEngine`: one engine worker in process, an `homing.engines.client.EngineApi` (what the
  pool, the outlier ejector and a lease use of `EngineClient`), so a `WorkerPool` built with
  `client_factory=client_factory([...])` runs over it with no network. It answers discovery
  with the simulated worker's own message builders (`homing.sim.discovery`: served model
  name, context window, EOS ids, page size; the served tokenizer zip of
  `homing.text.served`), answers health probes as told (`health`, `reachable`), serves an
  empty KV-event subscription that carries what the test publishes (`publish_kv`,
  `end_kv_streams`), and plays one script per Generate call.
- A script is a sequence of steps: `Chunk` (a streamed message of token ids), `Hold` (wait
  until the test opens a `Gate`), `Fail` (the call fails with a gRPC status) and `Done` (the
  complete message). Scripts queued with `FakeEngine.script` play in call order; a call with
  none queued plays `FakeEngine.default` (`echo_prompt`: the prompt's tokens back, one per
  chunk). The engine applies no sampling, stop or length rule of its own: it plays the script.
- `FakeStream` keeps `EngineStream`'s contract: `TokenChunk`s then one `GenerateDone`, then
  StopAsyncIteration; every end before the `GenerateDone` (a failure, `aclose`, the reader's
  cancellation, a script that runs out, a `sever`, the engine's `close`, the engine going
  unreachable) records an Abort of its request id, as the real client sends one; a
  `StreamWatcher` is told `answered`, `completed` and `failed` at the same points.
- What ends open calls, as with a real client: `FakeEngine.close` ends them as closing the
  gRPC channel does (the reader gets `asyncio.CancelledError`, grpc.aio's error for a call
  cancelled locally, and `EngineStream` lets it through: no `EngineError`, no watcher call);
  `reachable = False` ends them as a dead worker does (`EngineError(UNAVAILABLE)`,
  transport); the KV-event subscriptions likewise.
- `client_factory`: a `WorkerPool` `client_factory` over a set of `FakeEngine`s.

Nothing waits on time: a stream moves on when its reader asks and a `Gate` on its way is
open, yielding to the event loop once before each step (`asyncio.sleep(0)`), so other tasks
run between its messages, as between a real stream's. A call's `timeout_s` is recorded, not
enforced (script a `Fail(DEADLINE_EXCEEDED)` to play an expired deadline), and probes answer
at once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from homing.config.rules import check_worker_url
from homing.engines.client import (
    EngineError,
    GenerateDone,
    GenerateParams,
    HealthProbe,
    StreamWatcher,
    TokenChunk,
    build_generate_request,
)
from homing.sim import discovery
from homing.text.served import served_tokenizer_zip

#: What GetServerInfo reports as the SGLang version.
FAKE_VERSION = "homing-fake"

Health = Literal["ok", "unhealthy", "timeout"]

_urls = itertools.count()


class _Count:
    """A count that tasks can wait to reach (no polling)."""

    def __init__(self) -> None:
        self.value = 0
        self._changed = asyncio.Event()

    def add(self) -> None:
        self.value += 1
        self._changed.set()

    async def reached(self, count: int) -> None:
        while self.value < count:
            self._changed.clear()
            await self._changed.wait()


class Gate:
    """A point in a script (`Hold`) where streams wait until the test calls `open`.

    `arrivals`: streams that reached the gate so far (open or not); `waiting`: streams held
    there now. A gate once open stays open and lets later arrivals through at once.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._open = False
        self._held: set[asyncio.Future[None]] = set()
        self._arrivals = _Count()

    @property
    def is_open(self) -> bool:
        """Whether `open` was called."""
        return self._open

    @property
    def arrivals(self) -> int:
        """Streams that reached the gate so far."""
        return self._arrivals.value

    @property
    def waiting(self) -> int:
        """Streams held at the gate now."""
        return len(self._held)

    def open(self) -> None:
        """Let every held stream, and every later one, go on."""
        self._open = True
        for waiter in list(self._held):
            if not waiter.done():
                waiter.set_result(None)

    async def reached(self, count: int = 1) -> None:
        """Return once `count` streams have reached the gate (in all)."""
        await self._arrivals.reached(count)

    def _enter(self, waiter: asyncio.Future[None]) -> None:
        """A stream arrived: `waiter` resolves when the gate is (or is already) open."""
        self._arrivals.add()
        if self._open:
            waiter.set_result(None)
            return
        self._held.add(waiter)
        waiter.add_done_callback(self._held.discard)

    def __repr__(self) -> str:
        state = "open" if self._open else f"closed, {self.waiting} waiting"
        return f"Gate({self.name!r}, {state})"


@dataclass(frozen=True)
class Chunk:
    """One streamed message carrying `token_ids` (an empty tuple is an empty chunk). A
    request that does not stream (`GenerateParams.stream` False) gets them in its `Done`."""

    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Hold:
    """Wait here until `gate` is open (a `sever`, `aclose`, the engine's `close` or its going
    unreachable ends the wait)."""

    gate: Gate


@dataclass(frozen=True)
class Fail:
    """The call fails: the reader gets `EngineError(code, message)`; `transport` None
    derives it from the code (`homing.engines.client.TRANSPORT_CODES`)."""

    code: grpc.StatusCode
    message: str = "scripted failure"
    transport: bool | None = None


@dataclass(frozen=True)
class Done:
    """The complete message: `finish_reason` ("stop", "length" or "abort") and
    `matched_stop`. `tokens`: the final step's tokens that come only in the complete message
    (as older servicers sent them); without them a streamed complete repeats the last
    chunk's tokens, as SGLang 0.5.x does. A non-streamed complete carries every token."""

    finish_reason: str = "stop"
    matched_stop: int | str | None = None
    tokens: tuple[int, ...] = ()


Step = Chunk | Hold | Fail | Done

#: A Generate call's script from its params (`FakeEngine.default`).
ScriptSource = Callable[[GenerateParams], Sequence[Step]]


def per_token(token_ids: Iterable[int]) -> tuple[Chunk, ...]:
    """One `Chunk` per token id, in order."""
    return tuple(Chunk((token_id,)) for token_id in token_ids)


def echo_prompt(params: GenerateParams) -> tuple[Step, ...]:
    """The default script: the prompt's first `max_new_tokens` token ids back, one per chunk,
    then `Done` ("length" when `max_new_tokens` cut it, else "stop")."""
    count = min(len(params.input_ids), params.max_new_tokens)
    reason = "length" if count == params.max_new_tokens else "stop"
    return (*per_token(params.input_ids[:count]), Done(reason))


@dataclass(frozen=True)
class GenerateCall:
    """One `generate` call as the engine got it: its `params`, `timeout_s` (seconds, None
    for none), `traceparent`, and the `stream` it returned."""

    params: GenerateParams
    timeout_s: float | None
    traceparent: str | None
    stream: FakeStream


@dataclass(frozen=True)
class AbortRecord:
    """One Abort the engine received: `request_id` and the client's `reason`."""

    request_id: str
    reason: str


@dataclass(frozen=True)
class _Lost:
    """How the other side ended a call (the channel closed, the worker died): the reader's
    next read raises `error`, or CancelledError when it is None; `reason` is the Abort's."""

    error: EngineError | None
    reason: str


#: The end of a call whose channel was closed (`FakeEngine.close`).
_CHANNEL_CLOSED = _Lost(None, "cancelled")

#: What a KV subscription's queue carries: a batch, an error to raise, or None (the end).
_KvItem = bytes | BaseException | None


class FakeStream:
    """One Generate call of a `FakeEngine`, playing its script (module docstring); the same
    contract as `homing.engines.client.EngineStream`. `messages`: messages handed out."""

    def __init__(
        self,
        engine: FakeEngine,
        params: GenerateParams,
        steps: Sequence[Step],
        watcher: StreamWatcher | None,
    ) -> None:
        self.request_id = params.request_id
        self.messages = 0
        self._engine = engine
        self._steps = deque(steps)
        self._streaming = params.stream
        self._prompt_tokens = len(params.input_ids)
        self._watcher = watcher
        self._tokens: list[int] = []
        self._last_chunk: tuple[int, ...] = ()
        self._answered = False
        self._done = False  # the GenerateDone was returned
        self._ended = False  # nothing more will be read
        self._severed: EngineError | None = None  # set by `sever`
        self._lost: _Lost | None = None  # set by the engine's `close` or its going away
        self._waiter: asyncio.Future[None] | None = None  # a `Hold` in progress

    @property
    def ended(self) -> bool:
        """Nothing more will be read (completed, failed, closed or cut)."""
        return self._ended

    @property
    def completed(self) -> bool:
        """The `GenerateDone` was handed out."""
        return self._done

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> TokenChunk | GenerateDone:
        if self._ended:
            raise StopAsyncIteration
        try:
            while True:
                await asyncio.sleep(0)  # other tasks run between messages
                self._raise_if_cut()
                if self._ended:  # `aclose` from elsewhere: as a cancelled call's read
                    raise asyncio.CancelledError
                if not self._steps:
                    self._end("stream ended without complete")
                    raise self._failed(
                        EngineError(
                            grpc.StatusCode.INTERNAL,
                            f"Generate stream for {self.request_id} ended without a complete "
                            "message",
                            transport=True,
                            worker_id=self._engine.worker_id,
                        )
                    )
                step = self._steps.popleft()
                if isinstance(step, Hold):
                    await self._hold(step.gate)
                    self._raise_if_cut()
                elif isinstance(step, Fail):
                    self._end(f"rpc error {step.code.name}")
                    raise self._failed(
                        EngineError(
                            step.code,
                            step.message,
                            transport=step.transport,
                            worker_id=self._engine.worker_id,
                        )
                    )
                elif isinstance(step, Chunk):
                    self._tokens.extend(step.token_ids)
                    if self._streaming:
                        return self._chunk(step.token_ids)
                else:
                    return self._complete(step)
        except asyncio.CancelledError:
            self._end("cancelled")
            raise

    def _chunk(self, token_ids: tuple[int, ...]) -> TokenChunk:
        self._last_chunk = token_ids
        self.messages += 1
        if token_ids and not self._answered and self._watcher is not None:
            self._answered = True
            self._watcher.answered()
        return TokenChunk(
            token_ids, self._prompt_tokens, len(self._tokens), self._engine.cached_tokens
        )

    def _complete(self, done: Done) -> GenerateDone:
        self._tokens.extend(done.tokens)
        if not self._streaming:
            token_ids = tuple(self._tokens)
        else:
            token_ids = done.tokens or self._last_chunk
        self.messages += 1
        self._done = self._ended = True
        self._engine._streams.discard(self)
        if self._watcher is not None and done.finish_reason != "abort":
            if not self._answered:
                self._answered = True
                self._watcher.answered()
            self._watcher.completed()
        return GenerateDone(
            token_ids=token_ids,
            finish_reason=done.finish_reason,
            prompt_tokens=self._prompt_tokens,
            completion_tokens=len(self._tokens),
            cached_tokens=self._engine.cached_tokens,
            matched_stop=done.matched_stop,
        )

    async def _hold(self, gate: Gate) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        gate._enter(waiter)
        try:
            await waiter
        finally:
            self._waiter = None

    async def aclose(self) -> None:
        """Stop reading; records an Abort unless the stream completed. Idempotent. A read
        held at a `Hold` meanwhile raises CancelledError (as a cancelled gRPC call's)."""
        self._end("client closed the stream")
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()

    def sever(self, err: EngineError) -> bool:
        """Cut the call now: the reader's pending or next read raises `err`. False when the
        stream already ended."""
        if self._ended or self._severed is not None:
            return False
        self._severed = err
        self._wake()
        return True

    def _lose(self, lost: _Lost) -> bool:
        """The other side ended the call (`lost`): the reader's pending or next read fails
        so, unless it was severed first. False when the stream already ended."""
        if self._ended or self._severed is not None or self._lost is not None:
            return False
        self._lost = lost
        self._wake()
        return True

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _raise_if_cut(self) -> None:
        """Raise when the stream was severed (that error) or lost (its own), ending it first
        (the Abort, the watcher's `failed`) unless `aclose` already had."""
        if self._severed is not None:
            err, reason = self._severed, f"severed: {self._severed.message}"
        elif self._lost is not None:
            err, reason = self._lost.error, self._lost.reason
        else:
            return
        if not self._ended:
            self._end(reason)
            if err is not None:
                self._failed(err)
        if err is None:
            raise asyncio.CancelledError
        raise err

    def _failed(self, err: EngineError) -> EngineError:
        if self._watcher is not None:
            self._watcher.failed(err)
        return err

    def _end(self, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._engine._streams.discard(self)
        if not self._done:
            self._engine.aborts.append(AbortRecord(self.request_id, reason))


class FakeEngine:
    """One engine worker in process (module docstring); an `EngineApi`.

    `model`: the served model name. `context_length` (tokens), `page_size` (tokens per KV
    block), `max_running_requests` and `eos_token_ids`: what discovery reports.
    `tokenizer_zip`: the GetTokenizer bundle (default: the simulated worker's,
    `homing.text.served.served_tokenizer_zip`). `default`: the script of a call with none
    queued. `cached_tokens`: what every message reports as served from cache. `url`: a
    distinct `grpc://fake-N.invalid:50051` unless given; `worker_id` is the pool's name for
    it, set by `attach`.

    Settable: `health` ("ok", "unhealthy", "timeout": how probes answer) and `reachable`
    (False: as a dead worker, open Generate streams and KV subscriptions fail UNAVAILABLE,
    probes fail, discovery and new KV subscriptions raise UNAVAILABLE, and every new
    Generate call fails UNAVAILABLE without playing a script).
    Records: `calls` (every `generate`, in order), `aborts` (every Abort, sent or recorded by
    a stream that ended early), `probes` (health probes answered), `kv_subscriptions`
    (subscriptions opened), `closes` (`close` calls).
    """

    def __init__(
        self,
        *,
        model: str = "fake-model",
        context_length: int = 8192,
        page_size: int = 16,
        max_running_requests: int = 64,
        eos_token_ids: Sequence[int] = (),
        tokenizer_zip: bytes | None = None,
        default: ScriptSource = echo_prompt,
        cached_tokens: int = 0,
        url: str | None = None,
    ) -> None:
        self.model = model
        self.context_length = context_length
        self.page_size = page_size
        self.max_running_requests = max_running_requests
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer_zip = served_tokenizer_zip() if tokenizer_zip is None else tokenizer_zip
        self.default = default
        self.cached_tokens = cached_tokens
        self.url = check_worker_url(url or f"grpc://fake-{next(_urls)}.invalid:50051")
        self.worker_id = ""
        self.health: Health = "ok"
        self._reachable = True
        self.calls: list[GenerateCall] = []
        self.aborts: list[AbortRecord] = []
        self.probes = 0
        self.closes = 0
        self._scripts: deque[tuple[Step, ...]] = deque()
        self._streams: set[FakeStream] = set()
        self._subscribers: set[asyncio.Queue[_KvItem]] = set()
        self._subscribed = _Count()
        self._generated = _Count()

    def attach(self, worker_id: str) -> FakeEngine:
        """Take the pool's name for this worker (what `EngineClient` gets as `worker_id`)."""
        self.worker_id = worker_id
        return self

    # -- scripts and records --

    def script(self, *steps: Step) -> None:
        """Queue `steps` as the script of the next Generate call without one (calls take
        queued scripts in call order)."""
        self._scripts.append(steps)

    @property
    def queued_scripts(self) -> int:
        """Scripts queued and not yet taken by a call."""
        return len(self._scripts)

    @property
    def params(self) -> list[GenerateParams]:
        """The params of every `generate` call, in order."""
        return [call.params for call in self.calls]

    @property
    def kv_subscriptions(self) -> int:
        """KV-event subscriptions opened so far."""
        return self._subscribed.value

    async def generated(self, count: int = 1) -> None:
        """Return once `count` Generate calls have been made (in all)."""
        await self._generated.reached(count)

    async def kv_subscribed(self, count: int = 1) -> None:
        """Return once `count` KV-event subscriptions have been opened (in all)."""
        await self._subscribed.reached(count)

    @property
    def reachable(self) -> bool:
        """Whether the worker answers (module docstring); set False to play a dead worker."""
        return self._reachable

    @reachable.setter
    def reachable(self, value: bool) -> None:
        self._reachable = value
        if value:
            return
        for stream in list(self._streams):
            stream._lose(_Lost(self._gone(), "rpc error UNAVAILABLE"))
        for queue in self._subscribers:
            queue.put_nowait(self._gone())

    def _gone(self) -> EngineError:
        """An open call's error when the worker dies under it."""
        return EngineError(
            grpc.StatusCode.UNAVAILABLE, "Socket closed (fake)", worker_id=self.worker_id
        )

    def _unreachable(self) -> EngineError:
        return EngineError(
            grpc.StatusCode.UNAVAILABLE, "connection refused (fake)", worker_id=self.worker_id
        )

    # -- EngineApi --

    @property
    def open_streams(self) -> int:
        """Generate streams started and not yet ended."""
        return len(self._streams)

    def sever(self, reason: str) -> int:
        """Cut every open stream with `EngineError(UNAVAILABLE, reason, transport=True)`;
        returns how many were cut."""
        return sum(
            stream.sever(
                EngineError(
                    grpc.StatusCode.UNAVAILABLE, reason, transport=True, worker_id=self.worker_id
                )
            )
            for stream in list(self._streams)
        )

    def generate(
        self,
        params: GenerateParams,
        *,
        timeout_s: float | None = None,
        traceparent: str | None = None,
        watcher: StreamWatcher | None = None,
    ) -> FakeStream:
        """Start a call playing the next queued script (else `default(params)`); raises
        ValueError for params the real client refuses (`build_generate_request`)."""
        build_generate_request(params)
        steps: Sequence[Step]
        if not self.reachable:
            steps = (Fail(grpc.StatusCode.UNAVAILABLE, "connection refused (fake)"),)
        elif self._scripts:
            steps = self._scripts.popleft()
        else:
            steps = self.default(params)
        stream = FakeStream(self, params, steps, watcher)
        self._streams.add(stream)
        self.calls.append(GenerateCall(params, timeout_s, traceparent, stream))
        self._generated.add()
        return stream

    async def abort(self, request_id: str, reason: str = "") -> None:
        """Record an Abort of `request_id` (never raises)."""
        self.aborts.append(AbortRecord(request_id, reason))

    async def health_check(self, timeout_s: float = 2.0) -> bool:
        """Whether a probe answers healthy now."""
        return (await self.health_probe(timeout_s)).healthy

    async def health_probe(self, timeout_s: float = 2.0) -> HealthProbe:
        """A probe's answer from `health` and `reachable`, at once."""
        self.probes += 1
        if not self.reachable:
            return HealthProbe(False, message="connection refused (fake)")
        if self.health == "timeout":
            return HealthProbe(False, timed_out=True, message="Deadline Exceeded")
        if self.health == "unhealthy":
            return HealthProbe(False, message="Health check failed (fake)")
        return HealthProbe(True, message="Health check passed")

    async def model_info(self, timeout_s: float = 10.0) -> pb.GetModelInfoResponse:
        """GetModelInfo as the simulated worker answers it (`homing.sim.discovery`), its KV
        pool and context window both `context_length`; UNAVAILABLE when not `reachable`."""
        if not self.reachable:
            raise self._unreachable()
        return discovery.model_info_response(
            model_path=self._model_path,
            served_model_name=self.model,
            kv_capacity_tokens=self.context_length,
            max_req_input_len=self._max_req_input_len,
            eos_token_ids=self.eos_token_ids,
        )

    async def server_info(self, timeout_s: float = 10.0) -> pb.GetServerInfoResponse:
        """GetServerInfo as the simulated worker answers it (`homing.sim.discovery`; the
        `server_args` the pool and the admin API read, no live figures); UNAVAILABLE when
        not `reachable`."""
        if not self.reachable:
            raise self._unreachable()
        server_args = {
            "model_path": self._model_path,
            "tokenizer_path": self._model_path,
            "served_model_name": self.model,
            "grpc_mode": True,
            "tp_size": 1,
            "dp_size": 1,
            "page_size": self.page_size,
            "max_running_requests": self.max_running_requests,
            "max_total_tokens": self.context_length,
            "context_length": self.context_length,
        }
        return discovery.server_info_response(
            server_args,
            kv_capacity_tokens=self.context_length,
            max_running_requests=self.max_running_requests,
            max_req_input_len=self._max_req_input_len,
            sglang_version=FAKE_VERSION,
        )

    @property
    def _model_path(self) -> str:
        return f"{FAKE_VERSION}/{self.model}"

    @property
    def _max_req_input_len(self) -> int:
        return discovery.max_req_input_len(self.context_length, self.context_length)

    async def tokenizer_bundle(self, timeout_s: float = 60.0) -> bytes:
        """`tokenizer_zip`; UNAVAILABLE when not `reachable`."""
        if not self.reachable:
            raise self._unreachable()
        return self.tokenizer_zip

    async def subscribe_kv_events(self, start_sequence_number: int = 0) -> AsyncIterator[bytes]:
        """A subscription that yields what `publish_kv` sends while it is open, until
        `end_kv_streams`; UNAVAILABLE when not `reachable`, OUT_OF_RANGE for a start other
        than 0 (the simulated worker keeps no history)."""
        if not self.reachable:
            raise self._unreachable()
        if start_sequence_number != 0:
            raise EngineError(
                grpc.StatusCode.OUT_OF_RANGE,
                f"start_sequence_number {start_sequence_number} is not available",
                worker_id=self.worker_id,
            )
        queue: asyncio.Queue[_KvItem] = asyncio.Queue()
        self._subscribers.add(queue)
        self._subscribed.add()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._subscribers.discard(queue)

    async def close(self) -> None:
        """Close the channel (counted in `closes`): as grpc.aio cancels a closed channel's
        calls, every open Generate stream's pending or next read raises CancelledError (an
        Abort recorded, no `EngineError`, no watcher call: what `EngineStream` lets through)
        and so does every KV subscription's, batches not yet read dropped. The engine stays
        usable, as a client's channel is opened again on next use."""
        self.closes += 1
        for stream in list(self._streams):
            stream._lose(_CHANNEL_CLOSED)
        for queue in self._subscribers:
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(asyncio.CancelledError())

    # -- KV events --

    def publish_kv(self, batch: common_pb2.KvEventBatch | bytes) -> int:
        """Send `batch` to every open KV-event subscription; returns how many got it."""
        data = batch if isinstance(batch, bytes) else batch.SerializeToString()
        for queue in self._subscribers:
            queue.put_nowait(data)
        return len(self._subscribers)

    def end_kv_streams(self, code: grpc.StatusCode | None = None, message: str = "") -> int:
        """End every open KV-event subscription after what it was sent: normally, or failing
        with `EngineError(code, message)`. Returns how many were ended."""
        item = None if code is None else EngineError(code, message, worker_id=self.worker_id)
        for queue in self._subscribers:
            queue.put_nowait(item)
        return len(self._subscribers)

    def __repr__(self) -> str:
        return f"FakeEngine({self.worker_id or self.url!r}, model={self.model!r})"


class ClientFactory:
    """A `WorkerPool` `client_factory` giving each worker URL its engine (by
    `FakeEngine.url`), attached under the pool's worker id; KeyError for a URL of none.
    `add` makes one more engine known; `engines`: those handed out, by worker id."""

    def __init__(self, engines: Iterable[FakeEngine]) -> None:
        self._by_url = {engine.url: engine for engine in engines}
        self.engines: dict[str, FakeEngine] = {}

    def add(self, engine: FakeEngine) -> None:
        """Give `engine` to the pool's next client of its URL."""
        self._by_url[engine.url] = engine

    def __call__(self, url: str, worker_id: str) -> FakeEngine:
        engine = self._by_url[url].attach(worker_id)
        self.engines[worker_id] = engine
        return engine


def client_factory(engines: Iterable[FakeEngine]) -> ClientFactory:
    """A `WorkerPool` `client_factory` over `engines` (`ClientFactory`)."""
    return ClientFactory(engines)
