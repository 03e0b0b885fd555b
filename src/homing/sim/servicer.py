"""`sglang.grpc.scheduler.SglangScheduler` served by the simulated engine (grpc.aio).

Rule of this file: the protocol edge. It validates and converts messages, and leaves every
decision to the scheduler behind `EngineLoop`. Only this service (plus grpc.health.v1) is
registered, so other engines' services answer UNIMPLEMENTED, as do Embed, LoRA and profiling.

Behaviour, as SGLang's gRPC servicer (smg-grpc-proto 0.4.28):
- Generate, stream=True: one `chunk` per scheduler step that produced tokens (its new
  `token_ids`, cumulative prompt/completion/cached counts, index 0; a handler that fell behind
  sends the steps it missed as one chunk, as a busy SGLang tokenizer manager batches outputs),
  then always a `complete` (finish_reason "stop" | "length" | "abort", counts,
  matched_token_id on an EOS/stop token). An instant worker (`SimConfig.instant`) never
  merges steps: each step's tokens are their own chunk, however far behind the handler is.
  As SGLang 0.5.x's servicer does, the final step's tokens come in a last chunk (empty when
  the step produced none) and the `complete`'s
  `output_ids` repeat them; with `final_tokens = "complete_only"` they come only in the
  `complete`, as older servicers sent them. stream=False: a single `complete` carrying all
  output_ids. A client that goes away aborts its request.
- A full waiting queue (`max_queued_requests`) -> UNAVAILABLE ("The request queue is full",
  SGLang's 503); an injected `reject` fault -> that status for every Generate; an injected
  `report_kv_usage` replaces GetLoads' KV utilisation (as the KV-event hub's records).
- HealthCheck: unhealthy while an injected `health: false` fault is in force; during an
  injected stall it waits, as SGLang's one-token probe request would, and answers unhealthy
  after HEALTH_CHECK_TIMEOUT_S.
- Limits, as SGLang 0.5.23 (tp_worker.py, scheduler.py): max_req_len = min(context - 1,
  KV pool - 1) and max_req_input_len = max_req_len - 5. A prompt of max_req_input_len tokens
  or more -> INVALID_ARGUMENT with SGLang's message (its scheduler aborts the request with a
  400, which the servicer maps to INVALID_ARGUMENT). `max_new_tokens` is never refused: it is
  trimmed silently to max_req_len - prompt - 1 and to what an empty KV pool leaves
  (pool - prompt rounded up to a page - page - 1); unset means no limit but those.
- Invalid input -> INVALID_ARGUMENT: no tokenized input, empty input_ids, an id >= vocab_size,
  a prompt too long (above), temperature < 0, n > 1, a request id already in flight, a
  logit_bias key that is not a token id of the vocabulary, a `custom_params` "seed" that is
  not an integral number, a `logprob_start_len` past the prompt (SGLang's message) or below
  -1, a negative `top_logprobs_num` or one above the vocabulary (the last two kill SGLang's
  scheduler; the simulated worker refuses them instead).
- Constraints (json_schema, regex, ebnf_grammar, structural_tag), by `grammar_backend`
  (GetServerInfo's server_args say which): "simulated" compiles them with
  `homing.sim.grammar` (a refusal -> INVALID_ARGUMENT with SGLang's "Failed to compile ...
  grammar" message; ebnf is always refused) and answers one instance (one longer than the
  trimmed `max_new_tokens` ends at "length", a prefix of it); "none" refuses every
  one with SGLang's `--grammar-backend none` message; "unconstrained" ignores them.
- Sampling: logit_bias bans (-100) and forces (+100) tokens (see `homing.sim.generation`);
  `custom_params` {"seed": N} seeds a temperature > 0 answer (same seed, same answer; no
  seed: the request id), as the gateway sends OpenAI's `seed` (SGLang itself ignores the key);
  other `custom_params` are ignored, as by SGLang without a custom logit processor; the
  other sampling parameters shape a distribution the simulated worker does not have.
- Log probabilities (`return_logprob`; values from `homing.sim.logprobs`), framed as
  SGLang 0.5.23 frames them (see `homing.engines.client`): each chunk carries its tokens'
  `output_logprobs` (top entries: `top_logprobs_num`), the `complete` those of its
  `output_ids` (streaming: the last chunk's again; not streaming: all). Prompt logprobs
  (`logprob_start_len` >= 0: positions from there on, the first without a value) come in
  the first chunk only (and in the `complete` too when that chunk was the last), or in the
  `complete` when not streaming; `logprob_start_len` = prompt length gives none, and the
  radix-cache match of such a request stops at `logprob_start_len` tokens.
- `require_reasoning`: `reasoning_tokens` on chunks and the `complete` counts the output
  tokens up to and including `</think>` of a thinking answer (cumulative), as SGLang with a
  reasoning parser; 0 for an answer that does not reason.
- GetModelInfo reports what smg-grpc-servicer 0.14.1 reports for SGLang: `max_context_length`
  is the KV pool size (its `max_total_num_tokens`), and `vocab_size`, `bos_token_id`,
  `eos_token_ids`, `pad_token_id` are the servicer's defaults (SGLang's scheduler info carries
  none of them), `id2label_json` / `num_labels` the HF config defaults (two labels). The
  worker's own checks use its tokenizer's vocabulary and EOS ids.
- Abort, as smg-grpc-servicer 0.14.1: the request leaves the scheduler at once, and its
  Generate stream gets no further message and stays open until the client cancels the call
  (GetServerInfo's `active_requests` counts it until then, as SGLang's `rid_to_state`).
  `success` is true for any id, found or not ("Request <id> aborted": SGLang only forwards
  the abort), but false for an id starting with "HEALTH_CHECK" (SGLang's probe requests).
  The worker's own aborts (shutdown, restart) still end a stream with finish_reason "abort";
  a client that cancels its call aborts its request. An Abort takes the one request of that
  id (SGLang's scheduler takes every request whose id starts with it: not simulated).
- SubscribeKvEvents: `start_sequence_number` other than 0 -> OUT_OF_RANGE (the simulated
  worker keeps no replay history); else the hub's stream (see `homing.sim.kv_events`).
- GetTokenizer: the served tokenizer zip in `TOKENIZER_CHUNK_BYTES` chunks, the hex SHA-256
  of the whole zip on the last chunk only.
- FlushCache: waits up to `timeout_s` for the engine to go idle, then drops the cache (an
  AllBlocksCleared event); success False when it stayed busy.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.aio import off_loop_if
from homing.sim import discovery
from homing.sim.config import SimConfig
from homing.sim.engine_loop import EngineLoop
from homing.sim.generation import Answer, FixedOutput, OutputPlanner
from homing.sim.grammar import Constraint, GrammarRefused, compile_constraint
from homing.sim.kv_events import KvEventHub, SubscriberOverflow
from homing.sim.logprobs import input_logprobs, output_logprobs, prefill_only_logprobs
from homing.sim.scheduler import (
    LoadStats,
    QueueFull,
    RequestFinished,
    RequestOutput,
    SimRequest,
)
from homing.sim.timing import EngineLimits, TimingModel
from homing.text.served import tokenizer_bundle

log = logging.getLogger(__name__)

SIM_VERSION = "homing-sim"
"""What GetServerInfo / GetLoads report as the SGLang version."""

UNSET_MAX_NEW_TOKENS = 1 << 30
"""What SGLang's scheduler takes for an unset max_new_tokens before trimming it (scheduler.py
init_req_max_new_tokens)."""

TOKENIZER_CHUNK_BYTES = 512 * 1024
"""GetTokenizer chunk size (bytes); keeps every message far below gRPC's 4 MiB default."""

HEALTH_CHECK_TIMEOUT_S = 20.0
"""How long HealthCheck waits for a stalled engine (SGLang's SGLANG_HEALTH_CHECK_TIMEOUT)."""

HEALTH_CHECK_ID_PREFIX = "HEALTH_CHECK"
"""Request ids SGLang's servicer keeps for its own probe requests: Abort answers success false
for them (request_manager.abort_request)."""

LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
"""GetLoads `include` values SGLang accepts."""

GRAMMAR_UNSUPPORTED = (
    "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported "
    "when the server is launched with --grammar-backend none"
)
"""SGLang 0.5.23's refusal of a constrained request without a grammar backend (its scheduler's
grammar manager, a 400): the simulated worker's answer under `grammar_backend = "none"`."""


class InvalidRequest(ValueError):
    """A Generate request the worker refuses (INVALID_ARGUMENT)."""


@dataclass(frozen=True, slots=True)
class AnswerDetail:
    """What a request that asked for log probabilities or a reasoning count adds to its
    messages (see the module docstring); plain requests have none.

    `key`: the answer's draw seed (the output logprobs' key). `top_n`: top entries per
    position. `prompt_start`: first prompt position with logprobs, -1 for none. `think_end`:
    the output index of `</think>` when reasoning tokens are counted, else None.
    """

    input_ids: tuple[int, ...]
    logprobs: bool
    key: int
    greedy: bool
    top_n: int
    prompt_start: int
    think_end: int | None
    pool: tuple[int, ...]

    def reasoning_tokens(self, completion_tokens: int) -> int:
        """Reasoning tokens among the first `completion_tokens` output tokens."""
        if self.think_end is None:
            return 0
        return min(completion_tokens, self.think_end + 1)

    def prompt_logprobs(self) -> pb.InputLogProbs | None:
        """The prompt's entries, None when the request asked for none."""
        if not self.logprobs or not 0 <= self.prompt_start < len(self.input_ids):
            return None
        return input_logprobs(self.input_ids, self.prompt_start, self.top_n, self.pool)

    def fill_chunk(self, chunk: pb.GenerateStreamChunk, token_ids: list[int], first: bool) -> None:
        """Add `chunk`'s reasoning count and logprobs (prompt ones on the `first` chunk)."""
        chunk.reasoning_tokens = self.reasoning_tokens(chunk.completion_tokens)
        if not self.logprobs:
            return
        if token_ids:
            start = chunk.completion_tokens - len(token_ids)
            chunk.output_logprobs.CopyFrom(self._output(start, token_ids))
        if first and (prompt := self.prompt_logprobs()) is not None:
            chunk.input_logprobs.CopyFrom(prompt)

    def fill_complete(self, complete: pb.GenerateComplete, with_prompt: bool) -> None:
        """Add the `complete`'s reasoning count and the logprobs of its `output_ids` (and the
        prompt's when `with_prompt`)."""
        complete.reasoning_tokens = self.reasoning_tokens(complete.completion_tokens)
        if not self.logprobs:
            return
        token_ids = complete.output_ids
        if token_ids:
            start = complete.completion_tokens - len(token_ids)
            complete.output_logprobs.CopyFrom(self._output(start, token_ids))
        elif complete.completion_tokens == 0 and complete.finish_reason != "abort":
            complete.output_logprobs.CopyFrom(
                prefill_only_logprobs(self.key, self.top_n, self.greedy, self.pool)
            )
        if with_prompt and (prompt := self.prompt_logprobs()) is not None:
            complete.input_logprobs.CopyFrom(prompt)

    def _output(self, start: int, token_ids: Sequence[int]) -> pb.OutputLogProbs:
        return output_logprobs(
            self.key, max(start, 0), token_ids, self.top_n, self.greedy, self.pool
        )


@dataclass(frozen=True)
class ServedModel:
    """What the worker serves: the tokenizer's facts and the revision of the zip GetTokenizer
    streams (`homing.text.served.tokenizer_bundle`, built at the first call)."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    tokenizer_revision: str | None = None


class SimSchedulerServicer(pb_grpc.SglangSchedulerServicer):
    """The SglangScheduler service over one `EngineLoop` (see the module docstring)."""

    def __init__(
        self,
        config: SimConfig,
        *,
        engine: EngineLoop,
        hub: KvEventHub,
        planner: OutputPlanner,
        served: ServedModel,
        timing: TimingModel,
        limits: EngineLimits,
        port: int = 0,
    ) -> None:
        self.config = config
        self.engine = engine
        self.hub = hub
        self.planner = planner
        self.served = served
        self.timing = timing
        self.limits = limits
        self.port = port
        self.start_time = time.time()
        self.last_receive_time = 0.0

    # ---- limits ----

    @property
    def max_req_len(self) -> int:
        """Tokens one request may span (SGLang's max_req_len): min(context - 1, pool - 1)."""
        return discovery.max_req_len(self.limits.max_context_length, self.limits.kv_capacity_tokens)

    @property
    def max_req_input_len(self) -> int:
        """Prompts must be shorter than this (SGLang's max_req_input_len): max_req_len - 5."""
        return discovery.max_req_input_len(
            self.limits.max_context_length, self.limits.kv_capacity_tokens
        )

    def trimmed_max_new_tokens(self, input_len: int, requested: int | None) -> int:
        """`requested` (None = unset) as SGLang's scheduler trims it for a prompt of `input_len`
        tokens: to max_req_len - input_len - 1, then to the empty-pool budget
        pool - input_len rounded up to a page - page - 1; never below 0."""
        page = self.config.page_size
        paged_input = -(-input_len // page) * page
        budget = min(
            self.max_req_len - input_len - 1,
            self.limits.kv_capacity_tokens - paged_input - page - 1,
        )
        wanted = UNSET_MAX_NEW_TOKENS if requested is None else requested
        return max(0, min(wanted, budget))

    # ---- Generate ----

    def _logit_bias(self, params: pb.SamplingParams) -> dict[int, float]:
        """`logit_bias` keyed by token id, checked as SGLang's SamplingParams.verify does
        (keys parse as int, dedup on the int, ids in [0, vocab_size)); InvalidRequest else."""
        vocab = self.served.vocab_size
        bias: dict[int, float] = {}
        for key, value in params.logit_bias.items():
            try:
                token_id = int(key)
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from None
            if not 0 <= token_id < vocab:
                raise InvalidRequest(
                    f"logit_bias must has keys in [0, {vocab - 1}], got {token_id}."
                )
            bias[token_id] = value
        return bias

    def _seed(self, params: pb.SamplingParams) -> int | None:
        """`custom_params` "seed" as an int (None when absent); InvalidRequest unless it is an
        integral number."""
        if not params.HasField("custom_params"):
            return None
        fields = params.custom_params.fields
        if "seed" not in fields:
            return None
        value = fields["seed"]
        if value.WhichOneof("kind") == "number_value" and value.number_value.is_integer():
            return int(value.number_value)
        shown = json_format.MessageToJson(value, indent=None)
        raise InvalidRequest(f"custom_params seed must be an integral number, got {shown}")

    def _constraint(self, params: pb.SamplingParams) -> Constraint | None:
        """The request's compiled constraint under `grammar_backend` (None: none, or ignored);
        InvalidRequest with SGLang's message for a refused one."""
        field = params.WhichOneof("constraint")
        value = getattr(params, field) if field is not None else ""
        if not value:  # "": unset
            return None
        backend = self.config.grammar_backend
        if backend == "none":
            raise InvalidRequest(GRAMMAR_UNSUPPORTED)
        if backend == "unconstrained":
            return None
        try:
            return compile_constraint(field, value)  # type: ignore[arg-type]
        except GrammarRefused as exc:
            raise InvalidRequest(str(exc)) from None

    def _check_logprobs(self, request: pb.GenerateRequest, prompt_len: int) -> None:
        """Refuse logprob options SGLang refuses (or dies on); InvalidRequest."""
        start, top_n = request.logprob_start_len, request.top_logprobs_num
        if start < -1:
            raise InvalidRequest(f"logprob_start_len must be >= -1, got {start}")
        if start > prompt_len:
            raise InvalidRequest(
                f"req.logprob_start_len={start} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={prompt_len}. Please use a smaller "
                "logprob_start_len."
            )
        if not 0 <= top_n <= self.served.vocab_size:
            raise InvalidRequest(
                f"top_logprobs_num must be in [0, {self.served.vocab_size}], got {top_n}"
            )

    def build_request(self, request: pb.GenerateRequest) -> SimRequest:
        """Validate a GenerateRequest and turn it into a scheduler request.
        Raises InvalidRequest with a message for the client."""
        return self.build_generate(request)[0]

    def build_generate(self, request: pb.GenerateRequest) -> tuple[SimRequest, AnswerDetail | None]:
        """Validate a GenerateRequest: its scheduler request, and the `AnswerDetail` its
        messages need (None for a plain request). Raises InvalidRequest with a message for
        the client."""
        if not request.HasField("tokenized"):
            raise InvalidRequest("Tokenized input must be provided")
        input_ids = tuple(request.tokenized.input_ids)
        if not input_ids:
            raise InvalidRequest("input_ids is empty")
        vocab = self.served.vocab_size
        largest = max(input_ids)
        if largest >= vocab:
            bad = next(t for t in input_ids if t >= vocab)
            raise InvalidRequest(f"token id {bad} is out of range for vocab_size {vocab}")
        if len(input_ids) >= self.max_req_input_len:
            raise InvalidRequest(
                f"Input length ({len(input_ids)} tokens) exceeds the maximum allowed length "
                f"({self.max_req_input_len} tokens). Use a shorter input or enable "
                "--allow-auto-truncate."
            )
        params = request.sampling_params
        if params.n > 1:
            raise InvalidRequest("n > 1 is not supported by the simulated worker")
        if params.temperature < 0:
            raise InvalidRequest(f"temperature must be non-negative, got {params.temperature}")
        max_new_tokens = self.trimmed_max_new_tokens(
            len(input_ids),
            params.max_new_tokens if params.HasField("max_new_tokens") else None,
        )
        constraint = self._constraint(params)
        seed = self._seed(params)
        return_logprob = request.return_logprob
        if return_logprob:
            self._check_logprobs(request, len(input_ids))
        logit_bias = self._logit_bias(params)
        request_id = request.request_id or uuid.uuid4().hex
        output = self.planner.plan(
            input_ids,
            temperature=params.temperature,
            seed=seed,
            request_id=request_id,
            ignore_eos=params.ignore_eos,
            logit_bias=logit_bias,
            constraint=constraint,
            require_reasoning=request.require_reasoning,
            max_new_tokens=max_new_tokens,
        )
        detail: AnswerDetail | None = None
        cache_limit: int | None = None
        if return_logprob or request.require_reasoning:
            prompt_start = request.logprob_start_len if return_logprob else -1
            if prompt_start >= 0:
                cache_limit = prompt_start
            detail = AnswerDetail(
                input_ids=input_ids,
                logprobs=return_logprob,
                key=output.draw_seed,
                greedy=params.temperature <= 0.0,
                top_n=request.top_logprobs_num if return_logprob else 0,
                prompt_start=prompt_start,
                think_end=self._think_end(output) if request.require_reasoning else None,
                pool=self.planner.token_pool,
            )
        sim_request = SimRequest(
            request_id=request_id,
            input_ids=input_ids,
            max_new_tokens=max_new_tokens,
            output=output,
            stop_token_ids=frozenset(params.stop_token_ids),
            ignore_eos=params.ignore_eos,
            stream=request.stream,
            stream_interval=params.stream_interval or None,
            cache_limit=cache_limit,
        )
        return sim_request, detail

    def _think_end(self, output: Answer) -> int | None:
        """The output index of a thinking answer's `</think>` (None: the answer does not
        reason)."""
        tokens = self.planner.chat_tokens
        if tokens is None or not isinstance(output, FixedOutput):
            return None
        try:
            return output.prefix.index(tokens.think_end)
        except ValueError:
            return None

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.last_receive_time = time.time()
        reject = self.engine.faults.reject
        if reject is not None:
            await context.abort(
                grpc.StatusCode[reject], f"injected fault: this worker answers {reject}"
            )
            return
        try:
            # Drawing a constrained instance is up to ~1 s of work: off the loop, as SGLang
            # compiles grammars in a thread while the request waits.
            constrained = request.sampling_params.WhichOneof("constraint") is not None
            sim_request, detail = await off_loop_if(constrained, self.build_generate, request)
            stream = self.engine.submit(sim_request)
        except QueueFull as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            return
        except (InvalidRequest, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        except RuntimeError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            return
        rid = sim_request.request_id
        output_ids: list[int] = []
        repeat_final = self.config.final_tokens == "chunk_and_complete"
        chunk_per_step = self.config.instant
        chunks_sent = 0  # counted only for a request with an AnswerDetail
        try:
            async for batch in stream.batches():
                tokens: list[int] = []
                last: RequestOutput | None = None
                for item in batch:
                    if isinstance(item, RequestOutput):
                        if request.stream:
                            if chunk_per_step and last is not None:
                                response = _chunk_response(rid, tokens, last)
                                if detail is not None:
                                    detail.fill_chunk(response.chunk, tokens, not chunks_sent)
                                    chunks_sent += 1
                                yield response
                                tokens = []
                            tokens.extend(item.token_ids)
                            last = item
                        else:
                            output_ids.extend(item.token_ids)
                        continue
                    if request.stream:
                        # The final step's tokens: SGLang 0.5.x sends them in a last chunk
                        # (possibly empty) and repeats them in the complete; older
                        # servicers sent them in the complete only.
                        if repeat_final:
                            response = _chunk_response(rid, tokens, last or item)
                            if detail is not None:
                                detail.fill_chunk(response.chunk, tokens, not chunks_sent)
                                chunks_sent += 1
                            yield response
                        output_ids = tokens
                        last = None
                    complete = _complete(item, output_ids)
                    if detail is not None:
                        # prompt logprobs: not streaming, or the first chunk was the last
                        detail.fill_complete(
                            complete, not request.stream or chunks_sent <= int(repeat_final)
                        )
                    yield pb.GenerateResponse(request_id=rid, complete=complete)
                if last is not None:
                    response = _chunk_response(rid, tokens, last)
                    if detail is not None:
                        detail.fill_chunk(response.chunk, tokens, not chunks_sent)
                        chunks_sent += 1
                    yield response
        finally:
            # the client went away (or the handler was cancelled), or an Abort silenced it
            self.engine.close_stream(stream)

    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        rid = request.request_id
        if rid.startswith(HEALTH_CHECK_ID_PREFIX):
            return pb.AbortResponse(success=False, message=f"Request {rid} not found")
        # As SGLang's scheduler: every request whose id starts with `rid` stops (all for "");
        # only the one with exactly that id has its stream silenced, the others end "abort".
        for request_id in self.engine.open_request_ids():
            if request_id == rid:
                self.engine.client_abort(request_id)
            elif request_id.startswith(rid):
                self.engine.abort(request_id)
        return pb.AbortResponse(success=True, message=f"Request {rid} aborted")

    # ---- health and info ----

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> pb.HealthCheckResponse:
        if not self.engine.running:
            return pb.HealthCheckResponse(healthy=False, message="Server is shutting down")
        faults = self.engine.faults
        if not faults.healthy:
            return pb.HealthCheckResponse(healthy=False, message="Health check failed (injected)")
        now = self.engine.wall_now
        deadline = now() + HEALTH_CHECK_TIMEOUT_S
        while faults.stalled(now()):
            if now() >= deadline:
                return pb.HealthCheckResponse(
                    healthy=False,
                    message=f"Health check timeout after {HEALTH_CHECK_TIMEOUT_S:g}s",
                )
            await asyncio.sleep(min(0.05, max(deadline - now(), 0.0)))
        return pb.HealthCheckResponse(healthy=True, message="Health check passed")

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        return discovery.model_info_response(
            model_path=self.timing.model.hf_path,
            served_model_name=self.config.model_name,
            kv_capacity_tokens=self.limits.kv_capacity_tokens,
            max_req_input_len=self.max_req_input_len,
        )

    def server_args(self) -> dict[str, Any]:
        """The worker's settings under SGLang's ServerArgs names (plus `sim_*` extras)."""
        cfg, limits = self.config, self.limits
        return {
            "model_path": self.timing.model.hf_path,
            "tokenizer_path": self.timing.model.hf_path,
            "served_model_name": cfg.model_name,
            "host": "127.0.0.1",
            "port": self.port,
            "grpc_mode": True,
            "tp_size": cfg.tp,
            "dp_size": 1,
            "page_size": cfg.page_size,
            "chunked_prefill_size": cfg.chunked_prefill_size,
            "max_running_requests": limits.max_running_requests,
            "max_total_tokens": limits.kv_capacity_tokens,
            "context_length": limits.max_context_length,
            "mem_fraction_static": limits.mem_fraction_static,
            "schedule_policy": cfg.schedule_policy,
            "grammar_backend": cfg.grammar_backend,
            "max_queued_requests": cfg.max_queued_requests,
            "stream_interval": cfg.stream_interval,
            "enable_mixed_chunk": True,
            "disable_radix_cache": False,
            "kv_events_config": '{"publisher": "zmq"}',  # events on, as a real worker
            "device": "cuda",
            "sim_model": cfg.model,
            "sim_gpu": self.timing.gpu.name,
            "sim_speedup": cfg.speedup,
            "sim_seed": cfg.seed,
            "sim_instant": cfg.instant,
        }

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        start = Timestamp()
        start.FromSeconds(int(self.start_time))
        load = self.engine.load()
        return discovery.server_info_response(
            self.server_args(),
            kv_capacity_tokens=self.limits.kv_capacity_tokens,
            max_running_requests=self.limits.max_running_requests,
            max_req_input_len=self.max_req_input_len,
            sglang_version=SIM_VERSION,
            active_requests=load.num_running + load.num_waiting + self.engine.num_silenced_streams,
            last_receive_timestamp=self.last_receive_time,
            uptime_seconds=time.time() - self.start_time,
            start_time=start,
        )

    async def GetLoads(
        self, request: pb.GetLoadsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetLoadsResponse:
        include = set(request.include) or {"all"}
        unknown = include - LOAD_SECTIONS
        if unknown:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown GetLoads sections {sorted(unknown)}; valid: {sorted(LOAD_SECTIONS)}",
            )
        stats = self.engine.load()
        usage = self.engine.faults.kv_usage(stats.token_usage)
        if usage != stats.token_usage:  # an injected report_kv_usage
            stats = replace(stats, token_usage=usage)
        loads = []
        if not request.HasField("dp_rank") or request.dp_rank == 0:
            loads.append(self._scheduler_load(stats, include))
        aggregate = pb.AggregateMetrics(
            total_running_reqs=stats.num_running,
            total_waiting_reqs=stats.num_waiting,
            total_reqs=stats.num_running + stats.num_waiting,
            avg_token_usage=round(stats.token_usage, 4),
            avg_throughput=round(stats.gen_throughput, 2),
            avg_utilization=round(_utilization(stats), 4),
        )
        return pb.GetLoadsResponse(
            timestamp=datetime.now(UTC).isoformat(),
            version=SIM_VERSION,
            dp_rank_count=1,
            loads=loads,
            aggregate=aggregate,
        )

    def _scheduler_load(self, stats: LoadStats, include: set[str]) -> pb.SchedulerLoad:
        load = pb.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=stats.num_running,
            num_waiting_reqs=stats.num_waiting,
            num_total_reqs=stats.num_running + stats.num_waiting,
            num_used_tokens=stats.num_used_tokens,
            max_total_num_tokens=stats.max_total_num_tokens,
            token_usage=stats.token_usage,
            gen_throughput=stats.gen_throughput,
            cache_hit_rate=stats.cache_hit_rate,
            utilization=_utilization(stats),
            max_running_requests=stats.max_running_requests,
            num_waiting_uncached_tokens=stats.waiting_uncached_tokens,
        )
        if include & {"all", "memory"}:
            load.memory.CopyFrom(
                pb.MemoryMetrics(
                    weight_gb=self.timing.model.weight_bytes / self.config.tp / 1e9,
                    kv_cache_gb=self.limits.kv_capacity_tokens
                    * self.timing.kv_bytes_per_token
                    / self.config.tp
                    / 1e9,
                    graph_gb=0.0,
                    token_capacity=self.limits.kv_capacity_tokens,
                )
            )
        if include & {"all", "queues"}:
            load.queues.CopyFrom(pb.QueueMetrics(waiting=stats.num_waiting))
        return load

    # ---- tokenizer, events, cache ----

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        data, digest = await asyncio.to_thread(tokenizer_bundle, self.served.tokenizer_revision)
        step = TOKENIZER_CHUNK_BYTES
        starts = list(range(0, len(data), step)) or [0]
        for i, start in enumerate(starts):
            last = i == len(starts) - 1
            yield common_pb2.GetTokenizerChunk(
                data=data[start : start + step],
                sha256=digest if last else "",
            )

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        if request.start_sequence_number != 0:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"start_sequence_number {request.start_sequence_number} is not available: "
                f"the simulated worker keeps no event history (last sequence "
                f"{self.hub.last_sequence_number}); subscribe from 0",
            )
        subscription = self.hub.subscribe(
            load_records_before_first_batch=request.load_records_before_first_batch
        )
        await context.send_initial_metadata(())
        try:
            async for batch in subscription.batches():
                yield batch
        except SubscriberOverflow as exc:
            await context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        finally:
            subscription.close()

    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        try:
            async with asyncio.timeout(max(request.timeout_s, 0.0) + 5.0):
                success, message = await self.engine.flush_cache(request.timeout_s)
        except TimeoutError:
            success, message = False, "Cache not flushed: timed out"
        return common_pb2.FlushCacheResponse(success=success, message=message)


def _chunk_response(
    request_id: str, token_ids: list[int], last: RequestOutput | RequestFinished
) -> pb.GenerateResponse:
    """A `chunk` message with `token_ids` and the cumulative counts of `last`."""
    response = pb.GenerateResponse(request_id=request_id)
    chunk = response.chunk
    chunk.token_ids.extend(token_ids)
    chunk.prompt_tokens = last.prompt_tokens
    chunk.completion_tokens = last.completion_tokens
    chunk.cached_tokens = last.cached_tokens
    chunk.index = 0
    return response


def _complete(finished: RequestFinished, output_ids: list[int]) -> pb.GenerateComplete:
    complete = pb.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finished.finish_reason,
        prompt_tokens=finished.prompt_tokens,
        completion_tokens=finished.completion_tokens,
        cached_tokens=finished.cached_tokens,
        index=0,
    )
    if finished.matched_token_id is not None:
        complete.matched_token_id = finished.matched_token_id
    return complete


def _utilization(stats: LoadStats) -> float:
    """Running requests over the admission window."""
    return stats.num_running / stats.max_running_requests if stats.max_running_requests else 0.0
