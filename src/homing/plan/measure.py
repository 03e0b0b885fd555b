"""Per-replica figures from the simulated worker's timing model (`homing.sim.timing`) instead
of assumed ones, and the follow-up presets that scale the seed's figures with it.

The timing model is deterministic: every decode step of the same batch at the same context
takes the same time, so p95 TPOT is the step time. The decode batch at the SLO is the largest
running batch whose decode-only step, with every sequence at the workload's mean context
(prompt + answer / 2 tokens: halfway through its answer), takes at most the TPOT SLO, and
whose KV (batch x (prompt + answer) tokens) fits the replica's KV pool. The prefill rate is the
throughput of one prefill step filled with the workload's prompts (each its uncached tokens
after its cached prefix) up to SGLang's chunked-prefill budget of 8,192 tokens; a prompt
longer than the budget is prefilled alone in chunks of that size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from homing.plan.chain import Assumptions
from homing.sim.timing import PrefillChunk, TimingModel

CHUNKED_PREFILL_TOKENS = 8192
"""SGLang's default `chunked_prefill_size` (also `homing sim`'s)."""

MAX_BATCH = 100_000
"""Search bound for the decode batch (sequences); no preset comes near it."""


@dataclass(frozen=True)
class Measured:
    """What the timing model gives for one replica and workload.

    decode_batch: sequences at the TPOT SLO; decode_bound: "TPOT" or "KV" (which limit
    stopped it). step_ms: the decode step at that batch (ms). context_tokens: the mean
    context used (tokens). prefill_rate_tok_s: prefill throughput (tok/s). prompt_prefill_ms:
    one prompt's prefill alone on an idle replica (ms), a floor under TTFT.
    kv_capacity_tokens: the replica's KV pool (tokens).
    """

    decode_batch: int
    decode_bound: str
    step_ms: float
    context_tokens: int
    prefill_rate_tok_s: float
    prompt_prefill_ms: float
    kv_capacity_tokens: int


def measure(a: Assumptions) -> Measured:
    """Decode batch at the TPOT SLO and prefill rate for `a`'s model, GPU, TP and token
    shapes. Raises ValueError for an unknown model or GPU, weights that do not fit, or no batch
    meeting the TPOT SLO."""
    timing = TimingModel.from_names(a.model, a.gpu, a.tp)
    kv = timing.kv_capacity_tokens()
    context = a.prompt_tokens + a.answer_tokens // 2
    slo_s = a.tpot_slo_ms / 1000.0
    kv_limit = kv // max(1, a.prompt_tokens + a.answer_tokens)
    low, high = 0, min(MAX_BATCH, kv_limit)  # step time grows with the batch: bisect
    while low < high:
        mid = (low + high + 1) // 2
        if timing.decode_step_time_s(mid, context) <= slo_s:
            low = mid
        else:
            high = mid - 1
    batch = low
    if batch == 0:
        one = timing.decode_step_time_s(1, context) * 1000.0
        raise ValueError(
            f"{a.model} on {a.tp}x {a.gpu}: no decode batch meets the {a.tpot_slo_ms:g} ms TPOT"
            f" SLO (one sequence's step takes {one:.1f} ms"
            + (", or its KV does not fit)" if kv_limit == 0 else ")")
        )
    bound = "KV" if batch == kv_limit else "TPOT"
    new, cached = a.prompt_tokens - a.cached_tokens, a.cached_tokens
    if new >= CHUNKED_PREFILL_TOKENS or new == 0:
        size = max(new, 1)
        rate = size / timing.prefill_time_s(size, cached, chunk_tokens=CHUNKED_PREFILL_TOKENS)
    else:
        count = CHUNKED_PREFILL_TOKENS // new
        rate = count * new / timing.step_time_s([PrefillChunk(new, cached)] * count)
    return Measured(
        decode_batch=batch,
        decode_bound=bound,
        step_ms=timing.decode_step_time_s(batch, context) * 1000.0,
        context_tokens=context,
        prefill_rate_tok_s=rate,
        prompt_prefill_ms=timing.prefill_time_s(
            max(new, 1), cached, chunk_tokens=CHUNKED_PREFILL_TOKENS
        )
        * 1000.0,
        kv_capacity_tokens=kv,
    )


def measured(a: Assumptions) -> tuple[Assumptions, Measured]:
    """`a` with decode_batch and prefill_rate_tok_s replaced by the timing model's (an
    explicit decode goodput or prefill share is dropped), and the measurement."""
    m = measure(a)
    where = "measured above, timing model"
    return (
        dataclasses.replace(
            a,
            decode_batch=m.decode_batch,
            decode_goodput_tok_s=None,
            prefill_rate_tok_s=m.prefill_rate_tok_s,
            prefill_share=None,
            decode_source=where,
            prefill_source=where,
        ),
        m,
    )


def scaled(base: Assumptions, new: Assumptions) -> Assumptions:
    """`new` with the per-replica figures of `base` scaled by the timing model: decode batch
    (or goodput) x measured batch(new) / measured batch(base), prefill rate x measured
    rate(new) / measured rate(base). So a preset keeps the seed's calibration and changes only
    by what the timing model says its model or token shapes change. A fixed prefill share is
    kept as it is."""
    mb, mn = measure(base), measure(new)
    ratio = mn.decode_batch / mb.decode_batch
    return dataclasses.replace(
        new,
        decode_batch=base.decode_batch * ratio,
        decode_goodput_tok_s=(
            base.decode_goodput_tok_s * ratio if base.decode_goodput_tok_s is not None else None
        ),
        prefill_rate_tok_s=base.prefill_rate_tok_s * mn.prefill_rate_tok_s / mb.prefill_rate_tok_s,
        decode_source=f"the base's {base.decode_batch:g} x {mn.decode_batch} / {mb.decode_batch},"
        " the timing model's batches at the SLO",
        prefill_source=f"the base's {base.prefill_rate_tok_s:,.0f} x "
        f"{mn.prefill_rate_tok_s:,.0f} / {mb.prefill_rate_tok_s:,.0f}, the timing model's rates",
    )
