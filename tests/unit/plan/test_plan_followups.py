"""`homing.plan.presets`: each of the seed's follow-ups changes what it should, with the
figures `homing plan` prints for it."""

from __future__ import annotations

import pytest

from homing.plan.chain import Assumptions, PlanError, plan
from homing.plan.presets import agent, cache_hit, coding, smaller_model

BASE = plan(Assumptions())


def test_cache_hit_85_percent_lowers_prefill_demand_and_replicas_not_decode() -> None:
    p = plan(cache_hit(Assumptions(), 0.85))
    assert p.assumptions.cached_tokens == 1_275
    assert p.prefill_demand_tok_s == pytest.approx(37_500)  # 166.7 req/s x 225 tokens
    assert p.decode_replicas == BASE.decode_replicas
    assert p.prefill_share < BASE.prefill_share
    assert (p.replicas, p.gpus, p.cost_per_hour) == (38, 304, 760.0)


def test_a_smaller_model_changes_gpus_per_replica_and_cost() -> None:
    a = smaller_model(Assumptions())
    assert (a.model, a.tp, a.replica_gpus) == ("llama-3.1-8b", 1, 1)
    p = plan(a)
    assert p.decode_demand_tok_s == BASE.decode_demand_tok_s
    assert p.decode_goodput_tok_s > BASE.decode_goodput_tok_s
    assert (p.replicas, p.gpus, p.cost_per_hour) == (29, 29, 72.5)


def test_coding_has_fewer_requests_a_smaller_batch_and_a_lower_prefill_share() -> None:
    p = plan(coding(Assumptions()))
    assert p.request_rate_per_s == pytest.approx(250 / 3)  # 600-token answers
    assert p.prefill_demand_tok_s == pytest.approx(125_000 / 3)  # 500 uncached of 5,000
    assert p.assumptions.decode_batch < 96  # longer contexts: more KV read per step
    assert p.prefill_share < BASE.prefill_share
    assert (p.replicas, p.gpus, p.cost_per_hour) == (46, 368, 920.0)


def test_an_agent_is_prefill_bound() -> None:
    p = plan(agent(Assumptions()))
    assert p.prefill_demand_tok_s == pytest.approx(400_000)  # 333.3 req/s x 1,200 tokens
    assert p.prefill_share > 0.5
    assert (p.replicas, p.gpus, p.cost_per_hour) == (126, 1_008, 2_520.0)


def test_a_cache_hit_rate_outside_0_to_1_is_refused() -> None:
    with pytest.raises(PlanError) as info:
        cache_hit(Assumptions(), 1.2)
    assert str(info.value) == "--cache-hit must be between 0 and 1, got 1.2"
