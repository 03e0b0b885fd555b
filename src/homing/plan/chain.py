"""The seed's sizing chain: demand in tokens/s / goodput per replica, adjusted for prefill's
share of GPU time, plus headroom, then GPUs and cost. Pure arithmetic, no I/O.

With the defaults (`Assumptions()`, the seed's numbers, docs/architecture.md, "The sizing
chain") the chain gives:

    decode demand   = 10,000 users x 0.25 mid-generation x 20 tok/s       = 50,000 tok/s
    request rate    = 50,000 tok/s / 300 answer tokens                   = 166.7 req/s
    prefill demand  = 166.7 req/s x 500 uncached tokens                  = 83,333 tok/s
    decode goodput  = 96 sequences x 20 tok/s                            = 1,920 tok/s/replica
    decode replicas = 50,000 / 1,920                                     = 26.04
    with prefill    = 26.04 + 83,333 / 7,467 tok/s/replica (= 26.04 / 0.7) = 37.20
    with headroom   = 37.20 x 1.2 = 44.64 -> 45 replicas -> 360 GPUs -> $900/h -> $657,000/month
    gateway tier    = 8.12 cores -> 12 processes (`homing.plan.gateway`)

Rounding: every intermediate figure is carried unrounded; only the replica count is rounded,
up (`math.ceil`, after taking 1e-9 off so float noise never adds a replica), since demand must
be covered. `homing.plan.report` says how each figure is shown.

Prefill's share is not a constant here. Each replica spends a share s of its time on prefill
at `prefill_rate_tok_s` and the rest decoding at the decode goodput, so
replicas = decode demand / decode goodput + prefill demand / prefill rate, and
s = (prefill demand / prefill rate) / replicas. The default prefill rate, 22,400 / 3 =
7,467 tok/s per replica, is the one for which the seed's own case gives the seed's /0.7
(s = 0.3): a higher cache hit rate then lowers prefill demand and the replica count, as it
should. `prefill_share` fixes s instead (the seed's literal /0.7), ignoring prefill demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from homing.plan.errors import ChainOverflow, PlanError, shown
from homing.plan.gateway import GatewayAssumptions, GatewayTier, gateway_tier

SEED_USERS = 10_000
"""Concurrent chat users (the seed)."""
SEED_MID_GENERATION = 0.25
"""Share of users whose answer is being generated at any moment (the seed)."""
SEED_PROMPT_TOKENS = 1_500
SEED_CACHED_TOKENS = 1_000
SEED_ANSWER_TOKENS = 300
SEED_TTFT_SLO_MS = 500.0
SEED_TPOT_SLO_MS = 50.0
SEED_DECODE_BATCH = 96.0
"""Running batch per 8x H100 TP8 replica at which p95 TPOT meets 50 ms (the seed's planning
figure: 64-96; the chain takes the top of the range, which gives the seed's ~26)."""
SEED_DECODE_SHARE = 0.7
"""The seed's "/0.7 for prefill's share": decode's share of GPU time, prefill's is 0.3."""
SEED_HEADROOM = 0.2
SEED_GPU_PRICE = 2.50
"""$ per GPU-hour, H100 (the seed)."""
HOURS_PER_MONTH = 730.0
"""8,760 h / 12: the average month cloud price lists bill by."""

SEED_PREFILL_RATE = 22_400 / 3
"""Prefill tok/s per replica (7,466.7) for which the seed's case gives its /0.7: prefill
demand x 0.7 / (decode replicas x 0.3) = (250,000 / 3) x 0.7 / ((50,000 / 1,920) x 0.3)."""


#: Largest tensor-parallel degree planned for (a replica of 8 nodes of 8 GPUs).
MAX_TP = 64

#: Largest GPU count of one replica planned for (a replica spanning 64 nodes of 8 GPUs).
MAX_GPUS_PER_REPLICA = 512

#: Largest replica count the chain reports; beyond it the figures are float noise.
MAX_REPLICAS = 10**12


def _finite(step: str, value: float) -> float:
    """`value`, or ChainOverflow naming `step` when it is not finite."""
    if not math.isfinite(value):
        raise ChainOverflow(step)
    return value


@dataclass(frozen=True)
class Assumptions:
    """What the chain is computed from. Defaults are the seed's (docs/architecture.md, "The
    sizing chain").

    users: concurrent users (count, >= 0).
    mid_generation: share of users mid-answer at any moment (0..1); ignored when think_s is
        given.
    think_s / answer_s: alternative to mid_generation (seconds): a user reads and thinks for
        think_s between answers that take answer_s to stream (default answer_tokens x TPOT
        SLO); mid_generation = answer_s / (answer_s + think_s).
    prompt_tokens / cached_tokens: tokens per request, and how many of them hit the prefix
        cache (0..prompt_tokens).
    answer_tokens: generated tokens per request (> 0).
    ttft_slo_ms / tpot_slo_ms: p95 targets (ms, > 0); each user decodes at 1000 / tpot_slo_ms
        tok/s.
    decode_batch: running sequences per replica at which p95 TPOT meets the SLO.
    decode_goodput_tok_s: decode tok/s per replica; overrides decode_batch x 1 / TPOT.
    prefill_rate_tok_s: prefill tok/s per replica while it prefills (default: calibrated to
        the seed's /0.7, see the module docstring).
    prefill_share: fixed share of GPU time spent on prefill (0..1); overrides
        prefill_rate_tok_s.
    headroom: spare capacity on top (0.2 = +20%).
    model / gpu / tp: what one replica runs (names, as in `homing.sim.timing`).
    gpus_per_replica: GPUs one replica holds (default tp).
    gpu_price: $ per GPU-hour. hours_per_month: hours a month is billed for.
    decode_source / prefill_source: where decode_batch and prefill_rate_tok_s came from
        (printed with the chain).
    gateway: what the gateway tier is sized from (`homing.plan.gateway`).
    """

    users: float = SEED_USERS
    mid_generation: float = SEED_MID_GENERATION
    think_s: float | None = None
    answer_s: float | None = None
    prompt_tokens: int = SEED_PROMPT_TOKENS
    cached_tokens: int = SEED_CACHED_TOKENS
    answer_tokens: int = SEED_ANSWER_TOKENS
    ttft_slo_ms: float = SEED_TTFT_SLO_MS
    tpot_slo_ms: float = SEED_TPOT_SLO_MS
    decode_batch: float = SEED_DECODE_BATCH
    decode_goodput_tok_s: float | None = None
    prefill_rate_tok_s: float = SEED_PREFILL_RATE
    prefill_share: float | None = None
    headroom: float = SEED_HEADROOM
    model: str = "llama-3.1-70b"
    gpu: str = "H100"
    tp: int = 8
    gpus_per_replica: int | None = None
    gpu_price: float = SEED_GPU_PRICE
    hours_per_month: float = HOURS_PER_MONTH
    decode_source: str = "the seed's planning figure"
    prefill_source: str = "calibrated so the seed's case gives its /0.7"
    gateway: GatewayAssumptions = field(default_factory=GatewayAssumptions)

    def __post_init__(self) -> None:
        _check(self)

    @property
    def replica_gpus(self) -> int:
        """GPUs per replica: gpus_per_replica, or tp when unset."""
        return self.gpus_per_replica if self.gpus_per_replica is not None else self.tp

    @property
    def cache_hit(self) -> float:
        """cached_tokens / prompt_tokens (0 for an empty prompt)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _check(a: Assumptions) -> None:
    """Raise PlanError for the first assumption out of range."""

    def representable(option: str, value: float) -> None:
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                raise PlanError(option, f"is too large ({len(str(abs(value)))} digits)") from None

    def at_least(option: str, value: float, low: float) -> None:
        representable(option, value)
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= low):
            raise PlanError(option, f"must be >= {low:g}, got {shown(value)}")

    def positive(option: str, value: float) -> None:
        representable(option, value)
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise PlanError(option, f"must be > 0, got {shown(value)}")

    def fraction(option: str, value: float) -> None:
        if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
            raise PlanError(option, f"must be between 0 and 1, got {shown(value)}")

    at_least("--users", a.users, 0)
    fraction("--mid-generation", a.mid_generation)
    if a.think_s is not None:
        at_least("--think-s", a.think_s, 0)
    if a.answer_s is not None:
        positive("--answer-s", a.answer_s)
    at_least("--prompt-tokens", a.prompt_tokens, 0)
    at_least("--cached-tokens", a.cached_tokens, 0)
    if a.cached_tokens > a.prompt_tokens:
        raise PlanError(
            "--cached-tokens",
            f"({a.cached_tokens:,}) must not exceed --prompt-tokens ({a.prompt_tokens:,})",
        )
    positive("--answer-tokens", a.answer_tokens)
    positive("--ttft-slo-ms", a.ttft_slo_ms)
    positive("--tpot-slo-ms", a.tpot_slo_ms)
    positive("--decode-batch", a.decode_batch)
    if a.decode_goodput_tok_s is not None:
        positive("--decode-goodput", a.decode_goodput_tok_s)
    positive("--prefill-rate", a.prefill_rate_tok_s)
    if a.prefill_share is not None:
        fraction("--prefill-share", a.prefill_share)
        if a.prefill_share >= 1.0:
            raise PlanError("--prefill-share", f"must be below 1, got {shown(a.prefill_share)}")
    at_least("--headroom", a.headroom, 0)
    at_least("--tp", a.tp, 1)
    if a.tp > MAX_TP:
        raise PlanError("--tp", f"must be at most {MAX_TP}, got {shown(a.tp)}")
    if a.gpus_per_replica is not None:
        at_least("--gpus-per-replica", a.gpus_per_replica, 1)
        if a.gpus_per_replica > MAX_GPUS_PER_REPLICA:
            raise PlanError(
                "--gpus-per-replica",
                f"must be at most {MAX_GPUS_PER_REPLICA}, got {shown(a.gpus_per_replica)}",
            )
    at_least("--gpu-price", a.gpu_price, 0)
    positive("--hours-per-month", a.hours_per_month)


@dataclass(frozen=True)
class Plan:
    """Each step of the chain, unrounded (units in the names).

    per_user_tok_s: 1000 / TPOT SLO. mid_generation: the share used (given or from think
    time). prefill_share: share of GPU time on prefill, derived (or fixed when
    `assumptions.prefill_share` is set). replicas: the rounded-up count. gateway: the
    gateway tier for the request rate and the decode demand, every answer streamed.
    """

    assumptions: Assumptions
    mid_generation: float
    answer_s: float
    per_user_tok_s: float
    decode_demand_tok_s: float
    request_rate_per_s: float
    uncached_tokens: int
    prefill_demand_tok_s: float
    decode_goodput_tok_s: float
    decode_replicas: float
    prefill_replicas: float
    prefill_share: float
    replicas_before_headroom: float
    replicas_with_headroom: float
    replicas: int
    gpus: int
    cost_per_hour: float
    cost_per_month: float
    gateway: GatewayTier
    name: str = field(default="base")


def plan(a: Assumptions, name: str = "base") -> Plan:
    """The chain for `a` (see the module docstring); `name` labels it in reports."""
    per_user = 1000.0 / a.tpot_slo_ms
    answer_s = a.answer_s if a.answer_s is not None else a.answer_tokens / per_user
    if a.think_s is not None:
        mid = answer_s / _finite("the answer and think time", answer_s + a.think_s)
    else:
        mid = a.mid_generation
    decode_demand = a.users * mid * per_user
    request_rate = decode_demand / a.answer_tokens
    uncached = a.prompt_tokens - a.cached_tokens
    prefill_demand = request_rate * uncached
    goodput = (
        a.decode_goodput_tok_s if a.decode_goodput_tok_s is not None else a.decode_batch * per_user
    )
    decode_replicas = decode_demand / goodput
    if a.prefill_share is not None:
        before = decode_replicas / (1.0 - a.prefill_share)
        prefill_replicas = before - decode_replicas
        share = a.prefill_share
    else:
        prefill_replicas = prefill_demand / a.prefill_rate_tok_s
        before = decode_replicas + prefill_replicas
        share = prefill_replicas / before if before else 0.0
    for step, value in (
        ("the answer time", answer_s),
        ("the decode demand", decode_demand),
        ("the prefill demand", prefill_demand),
        ("the decode replicas", decode_replicas),
        ("the replicas before headroom", before),
    ):
        _finite(step, value)
    with_headroom = _finite("the replicas with headroom", before * (1.0 + a.headroom))
    if with_headroom > MAX_REPLICAS:
        raise ChainOverflow(
            "the replicas with headroom", f"{with_headroom:.3g} > {MAX_REPLICAS:.0e}"
        )
    replicas = max(0, math.ceil(with_headroom - 1e-9))
    gpus = replicas * a.replica_gpus
    per_hour = _finite("the cost per hour", gpus * a.gpu_price)
    _finite("the cost per month", per_hour * a.hours_per_month)
    return Plan(
        assumptions=a,
        mid_generation=mid,
        answer_s=answer_s,
        per_user_tok_s=per_user,
        decode_demand_tok_s=decode_demand,
        request_rate_per_s=request_rate,
        uncached_tokens=uncached,
        prefill_demand_tok_s=prefill_demand,
        decode_goodput_tok_s=goodput,
        decode_replicas=decode_replicas,
        prefill_replicas=prefill_replicas,
        prefill_share=share,
        replicas_before_headroom=before,
        replicas_with_headroom=with_headroom,
        replicas=replicas,
        gpus=gpus,
        cost_per_hour=per_hour,
        cost_per_month=per_hour * a.hours_per_month,
        gateway=gateway_tier(request_rate, a.prompt_tokens, decode_demand, a.gateway),
        name=name,
    )
