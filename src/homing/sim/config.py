"""Configuration of one simulated SGLang worker.

Rule of this file: every knob of the simulated worker lives in `SimConfig`, with the
default a user gets from `homing sim` / `make run`. `None` means "derive it from the
preset" (model x GPU x TP, see `homing.sim.timing`); the derivation happens in
`homing.sim.timing.resolve_limits`, never here, so this model stays plain data.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

FinalTokens = Literal["chunk_and_complete", "complete_only"]
FINAL_TOKENS: tuple[str, ...] = get_args(FinalTokens)
GrammarBackend = Literal["simulated", "none", "unconstrained"]
GRAMMAR_BACKENDS: tuple[str, ...] = get_args(GrammarBackend)


class SimConfig(BaseModel):
    """Settings of one simulated worker (all workers of a `homing sim` process share one).

    Fields:
        model: preset model name, e.g. "llama-3.1-8b" or "llama-3.1-70b".
        gpu: preset GPU name, "H100" or "H200".
        tp: tensor-parallel degree (GPUs per worker).
        page_size: tokens per KV page / event block (SGLang `--page-size`).
        chunked_prefill_size: prefill token budget per scheduler step (SGLang default 8192).
        max_running_requests: admission window; None = SGLang's derived default.
        kv_capacity_tokens: KV pool size in tokens; None = derived from GPU memory.
        mem_fraction_static: share of GPU memory for weights + KV pool; None = SGLang's
            TP-dependent default (0.88 at TP1 ... 0.81 at TP8).
        speedup: simulated time runs this many times faster than the wall clock.
        instant: switch the timing model off: every scheduler step takes zero time, so
            a request's tokens come as fast as the process can step and send them (a
            zero-latency worker, for measuring what sits in front of it). Each step's
            tokens still travel as their own chunk (`stream_interval` tokens per chunk),
            never merged with the next step's, so the framing is what a GPU worker's
            handler sends when it keeps up, whatever the client's speed.
        seed: mixed into sampled (temperature > 0) outputs; greedy outputs ignore it.
        served_model_name: name reported by GetModelInfo; None = `model`.
        tokenizer_revision: a label added to the GetTokenizer bundle (`REVISION`): the same
            tokenizer under another revision, whose bundle has another sha256.
        heartbeat_busy_s / heartbeat_idle_s: KV-event `load_only` heartbeat period (s)
            while the engine has requests / while it is idle.
        max_context_length: context window in tokens; None = the preset's (131072).
        schedule_policy: SGLang `--schedule-policy`, "fcfs" (default) or "lpm".
        max_queued_requests: waiting-queue bound; beyond it Generate answers UNAVAILABLE;
            None = unbounded (SGLang's default).
        stream_interval: tokens per streamed chunk (SGLang `--stream-interval`, default 1).
        jitter: each step's time is scaled by U(1 - jitter, 1 + jitter) (0 = exact model).
        final_tokens: where a streamed request's last step's tokens travel:
            "chunk_and_complete" (SGLang 0.5.x's servicer: a last `chunk`, then a `complete`
            whose `output_ids` repeat that chunk's tokens) or "complete_only" (older
            servicers: only in the `complete`).
        grammar_backend: "simulated" (the default, a stand-in for SGLang's default
            xgrammar backend: a `json_schema`, `regex` or `structural_tag` answer is one
            instance of the constraint, then EOS, an invalid or unsupported one is refused as
            SGLang refuses it, and `ebnf_grammar` is refused; see `homing.sim.grammar`),
            "none" (SGLang's `--grammar-backend none`: every constrained request is refused
            with INVALID_ARGUMENT) or "unconstrained" (constraints are accepted and ignored:
            answers as if unconstrained).
        tool_call_share: odds (0..1) that a chat prompt offering tools, its last turn the
            user's, is answered with a tool call in the served template's format (else a
            plain answer); 1.0 (the default): always.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "llama-3.1-8b"
    gpu: str = "H100"
    tp: int = Field(default=1, ge=1)
    page_size: int = Field(default=16, ge=1)
    chunked_prefill_size: int = Field(default=8192, ge=1)
    max_running_requests: int | None = Field(default=None, ge=1)
    kv_capacity_tokens: int | None = Field(default=None, ge=1)
    mem_fraction_static: float | None = Field(default=None, gt=0.0, le=1.0)
    speedup: float = Field(default=1.0, gt=0.0)
    instant: bool = False
    seed: int = 0
    served_model_name: str | None = None
    tokenizer_revision: str | None = Field(default=None, min_length=1, max_length=64)
    heartbeat_busy_s: float = Field(default=1.0, gt=0.0)
    heartbeat_idle_s: float = Field(default=5.0, gt=0.0)
    max_context_length: int | None = Field(default=None, ge=2)
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"
    max_queued_requests: int | None = Field(default=None, ge=0)
    stream_interval: int = Field(default=1, ge=1)
    jitter: float = Field(default=0.0, ge=0.0, lt=1.0)
    final_tokens: FinalTokens = "chunk_and_complete"
    grammar_backend: GrammarBackend = "simulated"
    tool_call_share: float = Field(default=1.0, ge=0.0, le=1.0)

    @property
    def model_name(self) -> str:
        """The name GetModelInfo reports (`served_model_name`, else `model`)."""
        return self.served_model_name or self.model
