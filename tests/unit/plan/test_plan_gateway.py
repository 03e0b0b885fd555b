"""The gateway tier of `homing plan`: cores from the request, prompt-token and streamed-token
rates, processes rounded up at the busy target, follow-ups scale it, and bad values are
refused."""

from __future__ import annotations

import dataclasses

import pytest

from homing.cli import main
from homing.plan import presets
from homing.plan.chain import Assumptions, plan
from homing.plan.errors import ChainOverflow, PlanError
from homing.plan.gateway import GatewayAssumptions, gateway_tier


def test_the_seeds_rates_need_about_eight_cores_and_twelve_processes() -> None:
    tier = plan(Assumptions()).gateway
    rate = 50_000 / 300
    assert tier.request_cores == pytest.approx(rate * 2.5e-3)
    assert tier.prompt_cores == pytest.approx(rate * 1_500 * 2e-6)
    assert tier.token_cores == pytest.approx(50_000 * 144e-6)
    assert tier.cores == pytest.approx(tier.request_cores + tier.prompt_cores + tier.token_cores)
    assert tier.processes_unrounded == pytest.approx(tier.cores / 0.7)
    assert tier.processes == 12


def test_a_cheaper_token_needs_fewer_processes_and_a_whole_count_is_not_rounded_up() -> None:
    at_8 = GatewayAssumptions(request_ms=0, prompt_token_us=0, token_us=29.3)  # interval 8
    assert gateway_tier(0, 0, 50_000, at_8).processes == 3
    exact = GatewayAssumptions(request_ms=0, prompt_token_us=0, token_us=10, busy_target=0.5)
    assert gateway_tier(0, 0, 100_000, exact).processes == 2  # 1 core / 0.5 exactly
    assert gateway_tier(0, 0, 0, exact).processes == 0


def test_long_prompts_cost_the_gateway_per_prompt_token() -> None:
    base = Assumptions()
    agent = plan(presets.agent(base))  # 12,000-token prompts at twice the request rate
    assert agent.assumptions.gateway == base.gateway
    assert agent.gateway.prompt_cores == pytest.approx(agent.request_rate_per_s * 12_000 * 2e-6)
    assert agent.gateway.prompt_cores > 10 * plan(base).gateway.prompt_cores
    assert agent.gateway.processes > plan(base).gateway.processes


@pytest.mark.parametrize(
    ("given", "option"),
    [
        ({"request_ms": -1}, "--gateway-request-ms"),
        ({"prompt_token_us": -0.5}, "--gateway-prompt-token-us"),
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
        gateway_tier(1.0, 1.0, 1.0, GatewayAssumptions(busy_target=1e-300))


def test_the_cli_takes_the_gateway_options_and_names_what_was_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--gateway-token-us", "29.3", "--gateway-prompt-token-us", "0"]
    assert main([*argv, "--gateway-busy", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "(--gateway-prompt-token-us, --gateway-token-us; the rest: bench-overhead" in out
    assert "= 0.42 + 0.00 + 1.47 = 1.88 cores" in out
    assert "1.88 cores / 0.5 busy per process = 3.76 -> 4 gateway processes" in out


def test_the_cli_refuses_a_bad_gateway_value_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--gateway-busy", "0"]) == 2
    assert capsys.readouterr().err == (
        "homing plan: --gateway-busy must be above 0 and at most 1, got 0\n"
    )


def test_the_chains_own_checks_come_before_the_gateway_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--users", "-1", "--gateway-busy", "2"]) == 2
    assert capsys.readouterr().err == "homing plan: --users must be >= 0, got -1\n"


def test_gateway_assumptions_survive_replace_like_every_other_field() -> None:
    a = dataclasses.replace(Assumptions(), users=20_000)
    assert a.gateway == GatewayAssumptions()
    assert plan(a).gateway.processes > plan(Assumptions()).gateway.processes
