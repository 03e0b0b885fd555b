"""The gateway tier of the sizing chain: the CPU cores, and the gateway processes of one core
each, that the chain's request rate, prompt tokens and streamed tokens need, from the
gateway's measured CPU per request, per prompt token and per streamed token. Pure
arithmetic, no I/O.

With the defaults and the seed's rates (166.7 req/s of 1,500-token prompts, 50,000 streamed
tok/s):

    gateway cores     = 166.7 req/s x (2.5 ms + 1,500 x 2 us) + 50,000 tok/s x 144 us
                      = 0.42 + 0.50 + 7.20 = 8.12
    gateway processes = 8.12 cores / 0.7 busy per process = 11.60 -> 12

Every answer is taken to be streamed (a chat product's are), at the stream interval the
per-token figure was measured at. The process count is rounded up like the replica count.
The busy share applies to a process's whole CPU (its event loop and gRPC's and the
tokenizer's threads), which is stricter than the loop-thread share the "auto" stream
interval reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from homing.plan.errors import ChainOverflow, PlanError, shown

GATEWAY_REQUEST_MS = 2.5
"""Gateway CPU per streamed request of a 16-token prompt, its answer's tokens aside (ms):
`python -m homing.bench.overhead --rounds 5` on 2026-12-07 (a 2-core AMD EPYC VM;
docs/benchmarks.md, "The engine-message path"), the intercept of the line through the
medians of its 64- and 256-token streams (11.76 and 39.45 ms)."""

GATEWAY_TOKEN_US = 144.0
"""Gateway CPU per streamed token at `stream_interval` 1 (us): the slope of that line."""

GATEWAY_PROMPT_TOKEN_US = 2.0
"""Gateway CPU per prompt token beyond the bench's 16 (us): rendering and tokenizing the chat
prompt (`TextTokenizer.encode_chat`'s CPU time, best of 7-9, from the 16-token prompt to
1,337-, 4,462- and 11,049-token ones: 1.2 to 2.5 us per token in two sittings on the same
machine and day, under load), taken near the top; the router's prefix hashing adds under a
tenth of it."""

GATEWAY_BUSY_TARGET = 0.7
"""Share of its core one gateway process is planned to keep busy: below the 0.85 busy share
at which `stream_interval = "auto"` starts sending tokens in chunks
(`homing.fleet.stream_interval`), with room left for bursts."""

MAX_PROCESSES = 10**12
"""Largest process count the tier reports; beyond it the figures are float noise."""

GATEWAY_SOURCE = "bench-overhead and encode_chat timings, 2026-12-07, 2-core VM, stream_interval 1"
"""Where the default figures come from, as the chain prints it."""


@dataclass(frozen=True)
class GatewayAssumptions:
    """What the gateway tier is sized from.

    request_ms: gateway CPU per request, its prompt's and answer's tokens aside (ms, >= 0).
    prompt_token_us: gateway CPU per prompt token (us, >= 0). token_us: gateway CPU per
    streamed token (us, >= 0). busy_target: share of one core a process may use
    (0 < x <= 1). source: where the costs came from (printed with the chain). PlanError for
    a value out of range, naming its `homing plan` option.
    """

    request_ms: float = GATEWAY_REQUEST_MS
    prompt_token_us: float = GATEWAY_PROMPT_TOKEN_US
    token_us: float = GATEWAY_TOKEN_US
    busy_target: float = GATEWAY_BUSY_TARGET
    source: str = GATEWAY_SOURCE

    def __post_init__(self) -> None:
        for option, value in (
            ("--gateway-request-ms", self.request_ms),
            ("--gateway-prompt-token-us", self.prompt_token_us),
            ("--gateway-token-us", self.token_us),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise PlanError(option, f"must be >= 0, got {shown(value)}")
        busy = self.busy_target
        if not (isinstance(busy, int | float) and 0 < busy <= 1):
            raise PlanError("--gateway-busy", f"must be above 0 and at most 1, got {shown(busy)}")


@dataclass(frozen=True)
class GatewayTier:
    """The gateway tier's step, unrounded (units in the names); `processes` rounded up."""

    assumptions: GatewayAssumptions
    request_cores: float
    prompt_cores: float
    token_cores: float
    cores: float
    processes_unrounded: float
    processes: int


def gateway_tier(
    request_rate_per_s: float, prompt_tokens: float, streamed_tok_s: float, g: GatewayAssumptions
) -> GatewayTier:
    """Cores = requests/s x (CPU per request + prompt tokens x CPU per prompt token) +
    streamed tok/s x CPU per streamed token; processes = cores / busy target, rounded up
    (1e-9 taken off first, as the replica count does). ChainOverflow when a figure is not
    finite or the count passes MAX_PROCESSES."""
    request_cores = request_rate_per_s * g.request_ms / 1e3
    prompt_cores = request_rate_per_s * prompt_tokens * g.prompt_token_us / 1e6
    token_cores = streamed_tok_s * g.token_us / 1e6
    cores = request_cores + prompt_cores + token_cores
    unrounded = cores / g.busy_target
    if not math.isfinite(unrounded):
        raise ChainOverflow("the gateway tier")
    if unrounded > MAX_PROCESSES:
        raise ChainOverflow("the gateway tier", f"{unrounded:.3g} > {MAX_PROCESSES:.0e} processes")
    return GatewayTier(
        assumptions=g,
        request_cores=request_cores,
        prompt_cores=prompt_cores,
        token_cores=token_cores,
        cores=cores,
        processes_unrounded=unrounded,
        processes=max(0, math.ceil(unrounded - 1e-9)),
    )
