"""`homing.plan.measure`: the per-replica figures `--measure` uses are the timing model's
(largest decode batch whose step meets the TPOT SLO, or whose KV fits; a full prefill step's
throughput), and presets scale the base's figures by the timing model's ratios."""

from __future__ import annotations

import dataclasses

import pytest

from homing.plan.chain import Assumptions, plan
from homing.plan.measure import CHUNKED_PREFILL_TOKENS, measure, measured, scaled
from homing.sim.timing import PrefillChunk, TimingModel


def test_the_decode_batch_is_the_largest_whose_step_meets_the_tpot_slo() -> None:
    m = measure(Assumptions())
    timing = TimingModel.from_names("llama-3.1-70b", "H100", 8)
    assert m.context_tokens == 1_650  # prompt + half the answer
    assert m.decode_bound == "TPOT"
    assert timing.decode_step_time_s(m.decode_batch, 1_650) <= 0.050
    assert timing.decode_step_time_s(m.decode_batch + 1, 1_650) > 0.050
    assert m.decode_batch == 100
    assert m.step_ms == pytest.approx(timing.decode_step_time_s(100, 1_650) * 1000)
    assert m.kv_capacity_tokens == timing.kv_capacity_tokens()


def test_the_prefill_rate_is_a_full_chunked_prefill_step_of_the_workloads_prompts() -> None:
    m = measure(Assumptions())
    timing = TimingModel.from_names("llama-3.1-70b", "H100", 8)
    count = CHUNKED_PREFILL_TOKENS // 500  # 16 prompts of 500 new tokens after 1,000 cached
    step = timing.step_time_s([PrefillChunk(500, 1_000)] * count)
    assert m.prefill_rate_tok_s == pytest.approx(count * 500 / step)
    assert m.prompt_prefill_ms == pytest.approx(timing.prefill_time_s(500, 1_000) * 1000)


def test_a_prompt_over_the_chunk_budget_is_prefilled_alone_in_chunks() -> None:
    a = Assumptions(prompt_tokens=20_000, cached_tokens=0)
    timing = TimingModel.from_names("llama-3.1-70b", "H100", 8)
    chunked = timing.prefill_time_s(20_000, 0, chunk_tokens=CHUNKED_PREFILL_TOKENS)
    assert measure(a).prefill_rate_tok_s == pytest.approx(20_000 / chunked)


def test_a_long_context_on_a_small_pool_is_kv_bound() -> None:
    a = Assumptions(model="llama-3.1-8b", tp=1, prompt_tokens=100_000, cached_tokens=99_000)
    m = measure(a)
    assert m.decode_bound == "KV"
    assert m.decode_batch == m.kv_capacity_tokens // 100_300


def test_measured_assumptions_carry_the_timing_models_figures_into_the_chain() -> None:
    a, m = measured(Assumptions(decode_goodput_tok_s=9_999.0, prefill_share=0.5))
    assert (a.decode_batch, a.prefill_rate_tok_s) == (m.decode_batch, m.prefill_rate_tok_s)
    assert (a.decode_goodput_tok_s, a.prefill_share) == (None, None)
    p = plan(a)
    assert p.decode_goodput_tok_s == 100 * 20.0
    assert p.prefill_replicas == pytest.approx(p.prefill_demand_tok_s / m.prefill_rate_tok_s)


def test_no_batch_meeting_the_slo_is_an_error_saying_so() -> None:
    with pytest.raises(ValueError) as info:
        measure(Assumptions(tpot_slo_ms=5.0))
    assert str(info.value) == (
        "llama-3.1-70b on 8x H100: no decode batch meets the 5 ms TPOT SLO "
        "(one sequence's step takes 12.8 ms)"
    )


def test_scaling_a_case_by_itself_changes_nothing() -> None:
    base = Assumptions()
    same = scaled(base, base)
    assert same.decode_batch == base.decode_batch
    assert same.prefill_rate_tok_s == pytest.approx(base.prefill_rate_tok_s)


def test_scaling_applies_the_timing_models_ratios_to_the_base_figures() -> None:
    base = Assumptions()
    new = dataclasses.replace(base, model="llama-3.1-8b", tp=1)
    s = scaled(base, new)
    mb, mn = measure(base), measure(new)
    assert s.decode_batch == pytest.approx(96 * mn.decode_batch / mb.decode_batch)
    assert s.prefill_rate_tok_s == pytest.approx(
        base.prefill_rate_tok_s * mn.prefill_rate_tok_s / mb.prefill_rate_tok_s
    )
    given = scaled(dataclasses.replace(base, decode_goodput_tok_s=2_000.0), new)
    assert given.decode_goodput_tok_s == pytest.approx(2_000 * mn.decode_batch / mb.decode_batch)
