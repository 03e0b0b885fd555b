"""`homing plan`: the sizing chain from the command line's assumptions (the seed's by
default), its follow-ups side by side, `--measure` and `--json`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from homing.plan.chain import Assumptions, Plan, PlanError, plan
from homing.plan.gateway import GATEWAY_SOURCE, GatewayAssumptions

DESCRIPTION = (
    "Size a fleet: decode demand / goodput per replica, plus prefill's share of GPU time, "
    "plus headroom, then GPUs and cost. Defaults are the seed's: 10,000 chat users on "
    "llama-3.1-70b, 8x H100 TP8 replicas, 1,500-token prompts of which 1,000 cached, "
    "300-token answers, p95 TTFT 500 ms and TPOT 50 ms."
)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `homing plan` (every default is `Assumptions`'s)."""
    d = Assumptions()
    load = p.add_argument_group("load")
    load.add_argument("--users", type=float, help=f"concurrent users (default {d.users:,})")
    mid = load.add_mutually_exclusive_group()
    mid.add_argument(
        "--mid-generation",
        type=float,
        help=f"share of users mid-answer at any moment, 0..1 (default {d.mid_generation})",
    )
    mid.add_argument(
        "--think-s",
        type=float,
        help="instead of --mid-generation: seconds a user thinks between answers "
        "(mid-generation = answer time / (answer time + think time))",
    )
    load.add_argument(
        "--answer-s",
        type=float,
        help="with --think-s: seconds an answer streams (default answer tokens x TPOT SLO)",
    )
    load.add_argument("--prompt-tokens", type=int, help=f"default {d.prompt_tokens:,}")
    load.add_argument(
        "--cached-tokens", type=int, help=f"prompt tokens in the prefix cache ({d.cached_tokens:,})"
    )
    load.add_argument("--answer-tokens", type=int, help=f"default {d.answer_tokens}")
    load.add_argument("--ttft-slo-ms", type=float, help=f"p95 TTFT (default {d.ttft_slo_ms:g})")
    load.add_argument("--tpot-slo-ms", type=float, help=f"p95 TPOT (default {d.tpot_slo_ms:g})")
    rep = p.add_argument_group("replica")
    rep.add_argument("--model", help=f"model name (default {d.model})")
    rep.add_argument("--gpu", help=f"GPU name (default {d.gpu})")
    rep.add_argument("--tp", type=int, help="tensor-parallel size (default: the model's preset)")
    rep.add_argument("--gpus-per-replica", type=int, help="GPUs per replica (default: --tp)")
    dec = rep.add_mutually_exclusive_group()
    dec.add_argument(
        "--decode-batch",
        type=float,
        help=f"running sequences per replica at the TPOT SLO (default {d.decode_batch:g}, "
        "the seed's planning figure)",
    )
    dec.add_argument("--decode-goodput", type=float, help="decode tok/s per replica")
    pre = rep.add_mutually_exclusive_group()
    pre.add_argument(
        "--prefill-rate",
        type=float,
        help=f"prefill tok/s per replica; prefill's share follows from it (default "
        f"{d.prefill_rate_tok_s:,.0f}, calibrated so the seed's case gives its /0.7)",
    )
    pre.add_argument(
        "--prefill-share",
        type=float,
        help="fix prefill's share of GPU time instead, 0..1 (the seed's /0.7 is 0.3)",
    )
    money = p.add_argument_group("money")
    money.add_argument("--headroom", type=float, help=f"spare share (default {d.headroom})")
    money.add_argument("--gpu-price", type=float, help=f"$/GPU-h (default {d.gpu_price:.2f})")
    money.add_argument(
        "--hours-per-month", type=float, help=f"default {d.hours_per_month:g} (8,760 / 12)"
    )
    g = d.gateway
    gw = p.add_argument_group("gateway tier")
    gw.add_argument(
        "--gateway-request-ms",
        type=float,
        help=f"gateway CPU per request, its tokens aside (default {g.request_ms:g}, measured: "
        f"{g.source})",
    )
    gw.add_argument(
        "--gateway-prompt-token-us",
        type=float,
        help=f"gateway CPU per prompt token (default {g.prompt_token_us:g}, measured)",
    )
    gw.add_argument(
        "--gateway-token-us",
        type=float,
        help=f"gateway CPU per streamed token at your stream interval (default {g.token_us:g}, "
        "measured at 1)",
    )
    gw.add_argument(
        "--gateway-busy",
        type=float,
        help=f"share of its core one gateway process may use (default {g.busy_target:g})",
    )
    out = p.add_argument_group("follow-ups and output")
    out.add_argument("--smaller-model", action="store_true", help="also plan llama-3.1-8b on 1 GPU")
    out.add_argument(
        "--coding", action="store_true", help="also plan a coding assistant's token shapes"
    )
    out.add_argument("--agent", action="store_true", help="also plan an agent's token shapes")
    out.add_argument(
        "--cache-hit", type=float, metavar="HIT", help="also plan with this prefix-cache hit rate"
    )
    out.add_argument(
        "--measure",
        action="store_true",
        help="take decode batch and prefill rate from the simulated worker's timing model",
    )
    out.add_argument("--json", action="store_true", help="print JSON instead")


_FIELDS = {
    "users": "users",
    "mid_generation": "mid_generation",
    "think_s": "think_s",
    "answer_s": "answer_s",
    "prompt_tokens": "prompt_tokens",
    "cached_tokens": "cached_tokens",
    "answer_tokens": "answer_tokens",
    "ttft_slo_ms": "ttft_slo_ms",
    "tpot_slo_ms": "tpot_slo_ms",
    "model": "model",
    "gpu": "gpu",
    "tp": "tp",
    "gpus_per_replica": "gpus_per_replica",
    "decode_batch": "decode_batch",
    "decode_goodput": "decode_goodput_tok_s",
    "prefill_rate": "prefill_rate_tok_s",
    "prefill_share": "prefill_share",
    "headroom": "headroom",
    "gpu_price": "gpu_price",
    "hours_per_month": "hours_per_month",
}
"""argparse dest -> Assumptions field."""

_GATEWAY_FIELDS = {
    "gateway_request_ms": "request_ms",
    "gateway_prompt_token_us": "prompt_token_us",
    "gateway_token_us": "token_us",
    "gateway_busy": "busy_target",
}
"""argparse dest -> GatewayAssumptions field."""


def assumptions_from(args: argparse.Namespace) -> Assumptions:
    """The base assumptions: `Assumptions()` with each given option. Raises PlanError or
    ValueError (unknown model) for a bad value."""
    given: dict[str, Any] = {
        field: getattr(args, dest)
        for dest, field in _FIELDS.items()
        if getattr(args, dest, None) is not None
    }
    users = given.get("users")
    if isinstance(users, float) and users.is_integer():
        given["users"] = int(users)
    from homing.sim.timing import gpu_spec, model_spec

    if args.model is not None:
        spec = model_spec(args.model)  # ValueError for an unknown one, whatever else is given
        if args.tp is None:
            given["tp"] = spec.default_tp
    if args.gpu is not None:
        gpu_spec(args.gpu)  # ValueError for an unknown one, with --measure or without
    if args.decode_batch is not None:
        given["decode_source"] = "--decode-batch"
    if args.decode_goodput is not None:
        given["decode_source"] = "--decode-goodput"
    if args.prefill_rate is not None:
        given["prefill_source"] = "--prefill-rate"
    gateway = {
        field: value
        for dest, field in _GATEWAY_FIELDS.items()
        if (value := getattr(args, dest, None)) is not None
    }
    if gateway:
        costs = [f"--gateway-{name}" for name in ("request-ms", "prompt-token-us", "token-us")]
        given_costs = [
            option for option in costs if getattr(args, option[2:].replace("-", "_")) is not None
        ]
        if given_costs:
            rest = "" if len(given_costs) == len(costs) else f"; the rest: {GATEWAY_SOURCE}"
            gateway["source"] = ", ".join(given_costs) + rest
    base = Assumptions(**given)  # its own checks first, as without gateway options
    if gateway:
        base = dataclasses.replace(base, gateway=GatewayAssumptions(**gateway))
    return base


def scenarios(args: argparse.Namespace) -> list[tuple[Plan, Any]]:
    """(chain, measurement or None) for the base and each follow-up asked for."""
    from homing.plan import presets

    base = assumptions_from(args)
    named: list[tuple[str, Assumptions]] = [("base", base)]
    if args.smaller_model:
        named.append(("smaller model", presets.smaller_model(base)))
    if args.coding:
        named.append(("coding", presets.coding(base)))
    if args.agent:
        named.append(("agent", presets.agent(base)))
    if args.cache_hit is not None:
        named.append((f"cache hit {args.cache_hit:.0%}", presets.cache_hit(base, args.cache_hit)))
    out: list[tuple[Plan, Any]] = []
    for name, a in named:
        m = None
        if args.measure:
            from homing.plan.measure import measured

            a, m = measured(a)
        out.append((plan(a, name), m))
    return out


def run_plan(args: argparse.Namespace) -> int:
    """Print the chains; 0, or 2 with one line "homing plan: <why>" for a bad assumption."""
    from homing.plan import report

    try:
        results = scenarios(args)
    except (PlanError, ValueError) as err:
        print(f"homing plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"scenarios": [report.to_json(p, m) for p, m in results]}, indent=2))
        return 0
    for i, (p, m) in enumerate(results):
        if i:
            print()
        print("\n".join(report.chain_lines(p, m)))
    if len(results) > 1:
        from rich.console import Console

        console = Console(highlight=False)
        if not console.is_terminal:
            console.width = 200
        console.print()
        console.print(report.comparison([p for p, _ in results]))
    return 0
