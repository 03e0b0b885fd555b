"""How `homing plan` shows a chain: step lines, a comparison table, and JSON.

Rounding as shown (the JSON carries every figure unrounded):
- tokens/s to the nearest unit, req/s to 0.1; the two demands, when not round, also show
  "~" and 2 significant figures (83,333 tok/s (~83,000));
- replica counts before the last step: 2 decimals and "~" the nearest integer; the final
  count is rounded up;
- $/h exact (cents when not whole); the month figure exact, then "~" rounded down to 2
  significant figures ($657,000 -> ~$650k).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rich.table import Table

from homing.plan.chain import Plan
from homing.plan.measure import CHUNKED_PREFILL_TOKENS, Measured


def num(x: float) -> str:
    """A count: whole numbers with thousands separators, else one decimal."""
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.1f}"


def sig2(x: float) -> float:
    """`x` rounded to 2 significant figures (nearest)."""
    return float(f"{x:.2g}") if x else 0.0


def floor_sig2(x: float) -> float:
    """`x` rounded down to 2 significant figures (x >= 0)."""
    if x <= 0:
        return 0.0
    unit = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.floor(x / unit + 1e-9) * unit


def rate(x: float) -> str:
    """tok/s to the nearest unit."""
    return f"{x:,.0f}"


def approx(x: float, unit: str) -> str:
    """`x` to the nearest unit, then "(~2 significant figures)" when that differs:
    "83,333 tok/s (~83,000)"."""
    shown, rounded = f"{x:,.0f}", f"{sig2(x):,.0f}"
    return f"{shown} {unit}" if rounded == shown else f"{shown} {unit} (~{rounded})"


def money(x: float) -> str:
    """Dollars, cents only when not whole: $900, $2.50."""
    return f"${x:,.0f}" if abs(x - round(x)) < 1e-9 else f"${x:,.2f}"


def month_headline(x: float) -> str:
    """The month figure rounded down to 2 significant figures: ~$650k, ~$1.2M."""
    v = floor_sig2(x)
    if v >= 1e6:
        return f"~${v / 1e6:g}M"
    if v >= 1e3:
        return f"~${v / 1e3:g}k"
    return f"~${v:g}"


def chain_lines(p: Plan, m: Measured | None = None) -> list[str]:
    """The chain of `p` step by step, as `homing plan` prints it."""
    a = p.assumptions
    tpot, per_user = a.tpot_slo_ms, p.per_user_tok_s
    lines = [
        f"{p.name}: {a.model} on {a.replica_gpus}x {a.gpu} (TP{a.tp}) per replica",
        f"  assumptions: {num(a.users)} users, prompt {a.prompt_tokens:,} tokens "
        f"({a.cached_tokens:,} cached: cache hit {a.cache_hit:.0%}), answer "
        f"{a.answer_tokens:,} tokens, p95 TTFT {a.ttft_slo_ms:g} ms, p95 TPOT {tpot:g} ms, "
        f"headroom {a.headroom:.0%}, {money(a.gpu_price)}/GPU-h, {a.hours_per_month:g} h/month",
    ]
    if m is not None:
        lines.append(
            f"  measured:        decode batch {m.decode_batch} ({m.decode_bound}-bound: step "
            f"{m.step_ms:.1f} ms at {m.context_tokens:,} tokens of context, p95 = the step "
            f"time; KV pool {m.kv_capacity_tokens:,} tokens), prefill "
            f"{m.prefill_rate_tok_s:,.0f} tok/s (steps of {CHUNKED_PREFILL_TOKENS:,} tokens), "
            f"one prompt's prefill alone {m.prompt_prefill_ms:.1f} ms of the "
            f"{a.ttft_slo_ms:g} ms TTFT SLO"
        )
    if a.think_s is not None:
        lines.append(
            f"  mid-generation  = {p.answer_s:g} s answer / ({p.answer_s:g} s + {a.think_s:g} s "
            f"think) = {p.mid_generation:.4g}"
        )
    lines += [
        f"  decode demand   = {num(a.users)} users x {p.mid_generation:.4g} mid-generation x "
        f"{per_user:g} tok/s (1 / {tpot:g} ms TPOT) = {approx(p.decode_demand_tok_s, 'tok/s')}",
        f"  request rate    = {rate(p.decode_demand_tok_s)} tok/s / {a.answer_tokens:,} answer "
        f"tokens = {p.request_rate_per_s:,.1f} req/s",
        f"  prefill demand  = {p.request_rate_per_s:,.1f} req/s x {p.uncached_tokens:,} uncached "
        f"tokens ({a.prompt_tokens:,} - {a.cached_tokens:,} cached) = "
        f"{approx(p.prefill_demand_tok_s, 'tok/s')}",
    ]
    if a.decode_goodput_tok_s is not None:
        lines.append(
            f"  decode goodput  = {rate(p.decode_goodput_tok_s)} tok/s per replica "
            f"({a.decode_source})"
        )
    else:
        lines.append(
            f"  decode goodput  = {num(a.decode_batch)} sequences at the TPOT SLO "
            f"({a.decode_source}) x {per_user:g} tok/s = {rate(p.decode_goodput_tok_s)} tok/s "
            "per replica"
        )
    d = p.decode_replicas
    lines.append(
        f"  decode replicas = {rate(p.decode_demand_tok_s)} / {rate(p.decode_goodput_tok_s)} = "
        f"{d:.2f} (~{round(d)})"
    )
    before = p.replicas_before_headroom
    gpus_word = "GPU" if a.replica_gpus == 1 else "GPUs"
    if a.prefill_share is not None:
        lines.append(
            f"  with prefill    = {d:.2f} / (1 - {a.prefill_share:g} prefill share) = "
            f"{before:.2f} (~{round(before)}; prefill's share fixed, --prefill-share)"
        )
    else:
        lines.append(
            f"  with prefill    = {d:.2f} + {rate(p.prefill_demand_tok_s)} / "
            f"{a.prefill_rate_tok_s:,.0f} tok/s per replica ({a.prefill_source}) = {d:.2f} + "
            f"{p.prefill_replicas:.2f} = {before:.2f} (~{round(before)}): prefill's share "
            f"{p.prefill_share:.0%}, i.e. {d:.2f} / {1 - p.prefill_share:.2f}"
        )
    lines += [
        f"  with headroom   = {before:.2f} x {1 + a.headroom:.2f} = {p.replicas_with_headroom:.2f}"
        f" -> {p.replicas:,} replicas (rounded up)",
        f"  GPUs            = {p.replicas:,} replicas x {a.replica_gpus} {gpus_word} = "
        f"{p.gpus:,} "
        f"{a.gpu}",
        f"  cost            = {p.gpus:,} x {money(a.gpu_price)}/GPU-h = "
        f"{money(p.cost_per_hour)}/h; x {a.hours_per_month:g} h/month = "
        f"{money(p.cost_per_month)}/month ({month_headline(p.cost_per_month)})",
    ]
    return lines + gateway_lines(p)


def gateway_lines(p: Plan) -> list[str]:
    """The gateway tier's two steps (`homing.plan.gateway`)."""
    t = p.gateway
    g = t.assumptions
    return [
        f"  gateway cores   = {p.request_rate_per_s:,.1f} req/s x ({g.request_ms:g} ms + "
        f"{p.assumptions.prompt_tokens:,} prompt tokens x {g.prompt_token_us:g} us) + "
        f"{rate(p.decode_demand_tok_s)} streamed tok/s x {g.token_us:g} us ({g.source}) = "
        f"{t.request_cores:.2f} + {t.prompt_cores:.2f} + {t.token_cores:.2f} = "
        f"{t.cores:.2f} cores",
        f"  gateway         = {t.cores:.2f} cores / {g.busy_target:g} busy per process = "
        f"{t.processes_unrounded:.2f} -> {t.processes:,} gateway "
        f"{'process' if t.processes == 1 else 'processes'} of one core (rounded up)",
    ]


def comparison(plans: list[Plan]) -> Table:
    """One row per chain: the figures a follow-up changes."""
    table = Table(title="homing plan: side by side")
    columns = [
        "scenario", "replica", "prompt / cached / answer", "decode tok/s", "prefill tok/s",
        "goodput tok/s/replica", "prefill share", "replicas", "GPUs", "$/h", "$/month",
        "gateway processes",
    ]  # fmt: skip
    for name in columns:
        table.add_column(name, justify="left" if name in columns[:3] else "right")
    for p in plans:
        a = p.assumptions
        table.add_row(
            p.name,
            f"{a.model} {a.replica_gpus}x {a.gpu}",
            f"{a.prompt_tokens:,} / {a.cached_tokens:,} / {a.answer_tokens:,}",
            f"{p.decode_demand_tok_s:,.0f}",
            f"{p.prefill_demand_tok_s:,.0f}",
            f"{p.decode_goodput_tok_s:,.0f}",
            f"{p.prefill_share:.0%}",
            f"{p.replicas:,}",
            f"{p.gpus:,}",
            money(p.cost_per_hour),
            f"{money(p.cost_per_month)} ({month_headline(p.cost_per_month)})",
            f"{p.gateway.processes:,}",
        )
    return table


def to_json(p: Plan, m: Measured | None = None) -> dict[str, Any]:
    """One chain as JSON: its assumptions, every step unrounded, what was measured (or null)
    and the headline figures as shown."""
    steps = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
    steps.pop("assumptions")
    gateway = dataclasses.asdict(steps.pop("gateway"))
    gateway.pop("assumptions")  # in "assumptions", with the chain's
    steps["gateway"] = gateway
    name = steps.pop("name")
    return {
        "name": name,
        "assumptions": dataclasses.asdict(p.assumptions),
        "steps": steps,
        "measured": dataclasses.asdict(m) if m is not None else None,
        "shown": {
            "decode_demand_tok_s": approx(p.decode_demand_tok_s, "tok/s"),
            "prefill_demand_tok_s": approx(p.prefill_demand_tok_s, "tok/s"),
            "decode_replicas": round(p.decode_replicas),
            "replicas_before_headroom": round(p.replicas_before_headroom),
            "replicas": p.replicas,
            "gpus": p.gpus,
            "cost_per_hour": money(p.cost_per_hour),
            "cost_per_month": month_headline(p.cost_per_month),
            "gateway_processes": p.gateway.processes,
        },
    }
