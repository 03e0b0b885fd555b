"""The gateway tier of `homing plan`: cores from the request and token rates, processes
rounded up at the busy target, follow-ups scale it, and bad values are refused."""

from __future__ import annotations

import dataclasses

import pytest

from homing.cli import main
from homing.plan import presets
from homing.plan.chain import Assumptions, plan
from homing.plan.errors import ChainOverflow, PlanError
from homing.plan.gateway import GatewayAssumptions, gateway_tier


def test_the_seeds_rates_need_about_seven_cores_and_eleven_processes() -> None:
    tier = plan(Assumptions()).gateway
    assert tier.request_cores == pytest.approx(50_000 / 300 * 3.4e-3)
    assert tier.token_cores == pytest.approx(50_000 * 130e-6)  # the 9.4 cores at 188 us
    assert tier.cores == pytest.approx(tier.request_cores + tier.token_cores)
    assert tier.processes_unrounded == pytest.approx(tier.cores / 0.7)
    assert tier.processes == 11


def test_a_cheaper_token_needs_fewer_processes_and_a_whole_count_is_not_rounded_up() -> None:
    at_8 = GatewayAssumptions(request_ms=0, token_us=29.3)  # stream_interval 8, measured
    assert gateway_tier(0, 50_000, at_8).processes == 3
    exact = GatewayAssumptions(request_ms=0, token_us=10, busy_target=0.5)
    assert gateway_tier(0, 100_000, exact).processes == 2  # 1 core / 0.5 exactly
    assert gateway_tier(0, 0, exact).processes == 0


def test_follow_ups_carry_the_gateway_figures_and_scale_with_their_rates() -> None:
    base = Assumptions(gateway=GatewayAssumptions(request_ms=1.0, token_us=50.0))
    agent = plan(presets.agent(base))
    assert agent.assumptions.gateway == base.gateway
    # the agent's shorter answers: more requests for the same tokens, so more request cores
    assert agent.gateway.request_cores > plan(base).gateway.request_cores


@pytest.mark.parametrize(
    ("given", "option"),
    [
        ({"request_ms": -1}, "--gateway-request-ms"),
        ({"token_us": float("nan")}, "--gateway-token-us"),
        ({"token_us": float("inf")}, "--gateway-token-us"),
        ({"busy_target": 0}, "--gateway-busy"),
        ({"busy_target": 1.01}, "--gateway-busy"),
    ],
)
def test_a_gateway_figure_out_of_range_is_refused_naming_its_option(
    given: dict[str, float], option: str
) -> None:
    with pytest.raises(PlanError) as caught:
        GatewayAssumptions(**given)  # type: ignore[arg-type]
    assert caught.value.option == option


def test_a_busy_target_too_small_to_size_overflows() -> None:
    with pytest.raises(ChainOverflow, match="gateway tier"):
        gateway_tier(1.0, 1.0, GatewayAssumptions(busy_target=1e-300))


def test_the_cli_takes_the_gateway_options_and_names_what_was_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--gateway-token-us", "29.3", "--gateway-busy", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "x 29.3 us (--gateway-token-us; the other: make bench-overhead" in out
    assert "= 0.57 + 1.47 = 2.03 cores" in out
    assert "2.03 cores / 0.5 busy per process = 4.06 -> 5 gateway processes" in out


def test_the_cli_refuses_a_bad_gateway_value_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--gateway-busy", "0"]) == 2
    assert capsys.readouterr().err == (
        "homing plan: --gateway-busy must be above 0 and at most 1, got 0\n"
    )


def test_gateway_assumptions_survive_replace_like_every_other_field() -> None:
    a = dataclasses.replace(Assumptions(), users=20_000)
    assert a.gateway == GatewayAssumptions()
    assert plan(a).gateway.processes > plan(Assumptions()).gateway.processes
