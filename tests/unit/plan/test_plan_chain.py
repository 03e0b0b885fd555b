"""`homing.plan.chain`: the seed's sizing chain gives the seed's figures exactly, each step
rounded as stated; prefill's share follows prefill demand; out-of-range assumptions are
refused with the option's name."""

from __future__ import annotations

import dataclasses
import math

import pytest

from homing.plan.chain import SEED_PREFILL_RATE, Assumptions, PlanError, plan
from homing.plan.report import approx, floor_sig2, month_headline


def test_the_seed_assumptions_give_the_seed_figures() -> None:
    p = plan(Assumptions())
    assert p.per_user_tok_s == 20.0
    assert p.decode_demand_tok_s == 50_000.0
    assert p.request_rate_per_s == pytest.approx(500 / 3)  # 166.7 req/s
    assert p.uncached_tokens == 500
    assert p.prefill_demand_tok_s == pytest.approx(250_000 / 3)  # 83,333 tok/s
    assert approx(p.prefill_demand_tok_s, "tok/s") == "83,333 tok/s (~83,000)"
    assert p.decode_goodput_tok_s == 1_920.0  # 96 sequences x 20 tok/s
    assert p.decode_replicas == pytest.approx(50_000 / 1_920)
    assert round(p.decode_replicas) == 26
    assert p.prefill_share == pytest.approx(0.3)  # the seed's /0.7
    assert p.replicas_before_headroom == pytest.approx(50_000 / 1_920 / 0.7)
    assert round(p.replicas_before_headroom) == 37
    assert p.replicas_with_headroom == pytest.approx(44.642857)
    assert p.replicas == 45
    assert p.gpus == 360
    assert p.cost_per_hour == 900.0
    assert p.cost_per_month == 657_000.0  # x 730 h
    assert month_headline(p.cost_per_month) == "~$650k"


def test_the_default_prefill_rate_is_the_one_that_reproduces_the_seeds_0_7() -> None:
    fixed = plan(Assumptions(prefill_share=0.3))
    derived = plan(Assumptions())
    assert SEED_PREFILL_RATE == pytest.approx(7_466.667, abs=1e-3)
    assert derived.replicas_before_headroom == pytest.approx(fixed.replicas_before_headroom)
    assert derived.prefill_replicas == pytest.approx(fixed.prefill_replicas)


def test_a_derived_prefill_share_follows_prefill_demand_and_a_fixed_one_does_not() -> None:
    fewer = dataclasses.replace(Assumptions(), cached_tokens=1_275)  # 85% cache hit
    assert plan(fewer).prefill_share < 0.3
    assert plan(fewer).replicas < plan(Assumptions()).replicas
    fixed = dataclasses.replace(fewer, prefill_share=0.3)
    assert plan(fixed).replicas == plan(Assumptions(prefill_share=0.3)).replicas == 45


def test_think_time_gives_the_same_chain_as_the_mid_generation_share_it_implies() -> None:
    p = plan(Assumptions(think_s=45.0))  # a 300-token answer streams in 15 s at 50 ms/token
    assert p.answer_s == 15.0
    assert p.mid_generation == 0.25
    assert p.replicas == 45
    assert plan(Assumptions(think_s=10.0, answer_s=10.0)).mid_generation == 0.5


def test_a_goodput_given_directly_replaces_batch_times_rate() -> None:
    p = plan(Assumptions(decode_goodput_tok_s=2_500.0))
    assert p.decode_goodput_tok_s == 2_500.0
    assert p.decode_replicas == 20.0


def test_zero_users_need_zero_replicas_without_nan() -> None:
    p = plan(Assumptions(users=0))
    assert (p.replicas, p.gpus, p.cost_per_month, p.prefill_share) == (0, 0, 0.0, 0.0)
    assert not any(
        isinstance(v, float) and math.isnan(v)
        for v in dataclasses.asdict(p).values()
        if not isinstance(v, dict)
    )


def test_a_whole_replica_count_is_not_rounded_up_by_float_noise() -> None:
    # 50,000 / (50,000 / 45) is 45.000000000000007 in floating point: still 45 replicas.
    p = plan(Assumptions(decode_goodput_tok_s=50_000 / 45, prefill_share=0.0, headroom=0.0))
    assert p.replicas == 45


def test_gpus_per_replica_defaults_to_tp() -> None:
    assert plan(Assumptions(tp=4)).gpus == 45 * 4
    assert plan(Assumptions(tp=4, gpus_per_replica=8)).gpus == 360


def test_money_headline_rounds_down_to_two_significant_figures() -> None:
    assert floor_sig2(657_000) == 650_000
    assert month_headline(554_800) == "~$550k"
    assert month_headline(1_839_600) == "~$1.8M"
    assert month_headline(41_975) == "~$41k"
    assert month_headline(0) == "~$0"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"users": -1}, "--users must be >= 0, got -1"),
        ({"mid_generation": 1.5}, "--mid-generation must be between 0 and 1, got 1.5"),
        ({"mid_generation": -0.1}, "--mid-generation must be between 0 and 1, got -0.1"),
        ({"think_s": -1.0}, "--think-s must be >= 0, got -1"),
        ({"answer_s": 0.0}, "--answer-s must be > 0, got 0"),
        ({"prompt_tokens": -1}, "--prompt-tokens must be >= 0, got -1"),
        (
            {"cached_tokens": 2_000},
            "--cached-tokens (2,000) must not exceed --prompt-tokens (1,500)",
        ),
        ({"answer_tokens": 0}, "--answer-tokens must be > 0, got 0"),
        ({"ttft_slo_ms": 0.0}, "--ttft-slo-ms must be > 0, got 0"),
        ({"tpot_slo_ms": 0.0}, "--tpot-slo-ms must be > 0, got 0"),
        ({"tpot_slo_ms": math.inf}, "--tpot-slo-ms must be > 0, got inf"),
        ({"decode_batch": 0.0}, "--decode-batch must be > 0, got 0"),
        ({"decode_goodput_tok_s": -5.0}, "--decode-goodput must be > 0, got -5"),
        ({"prefill_rate_tok_s": 0.0}, "--prefill-rate must be > 0, got 0"),
        ({"prefill_share": 1.0}, "--prefill-share must be below 1, got 1"),
        ({"prefill_share": -0.2}, "--prefill-share must be between 0 and 1, got -0.2"),
        ({"headroom": -0.1}, "--headroom must be >= 0, got -0.1"),
        ({"tp": 0}, "--tp must be >= 1, got 0"),
        ({"gpus_per_replica": 0}, "--gpus-per-replica must be >= 1, got 0"),
        ({"gpu_price": -1.0}, "--gpu-price must be >= 0, got -1"),
        ({"hours_per_month": 0.0}, "--hours-per-month must be > 0, got 0"),
    ],
)
def test_an_assumption_out_of_range_is_refused_naming_its_option(
    change: dict[str, float], message: str
) -> None:
    with pytest.raises(PlanError) as info:
        Assumptions(**change)  # type: ignore[arg-type]
    assert str(info.value) == message
