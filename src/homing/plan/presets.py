"""The seed's follow-ups as presets: each swaps a few assumptions of the base and scales its
per-replica figures with the timing model (`homing.plan.measure.scaled`). Users and the
mid-generation share stay the base's, so each follow-up changes only what it names.

smaller model: llama-3.1-8b on one GPU (TP1, 1 GPU per replica) of the base's kind.

coding (a chat/edit coding assistant): prompt 5,000 tokens, 4,500 cached (90%), answer 600.
    The Azure 2023 code trace (../shared/traces/azure2023, measured on the file: mean context
    2,048 tokens, p90 5,194, mean output 28) is completion traffic; an assistant that edits
    code carries open files and the conversation, so its prompt is taken at that trace's p90.
    The files and history repeat from turn to turn, so 90% hits the prefix cache
    (assumed: that trace has no prefix information). Answers are code edits, twice the seed's
    chat answer (assumed).

agent (many turns on one growing context): prompt 12,000 tokens, 10,800 cached (90%),
    answer 150. The Mooncake conversation trace (../shared/traces/mooncake, measured: mean
    input 12,035 tokens, mean output 343) gives the long multi-turn context; each agent step
    resends it and appends one tool result and its previous output, ~1,200 new tokens, so
    90% is cached (assumed; with one unbounded cache across all users the trace's reuse is
    37%). Answers are tool calls and short steps: 150 tokens (assumed).

cache hit X: cached tokens = round(prompt x X); the seed's follow-up is 0.65 -> 0.85.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from homing.plan.chain import Assumptions, PlanError
from homing.plan.measure import scaled

SMALLER_MODEL = "llama-3.1-8b"
CODING = {"prompt_tokens": 5_000, "cached_tokens": 4_500, "answer_tokens": 600}
AGENT = {"prompt_tokens": 12_000, "cached_tokens": 10_800, "answer_tokens": 150}


def smaller_model(base: Assumptions) -> Assumptions:
    """llama-3.1-8b on one GPU of the base's kind, figures scaled by the timing model."""
    new = dataclasses.replace(base, model=SMALLER_MODEL, tp=1, gpus_per_replica=1)
    return scaled(base, new)


def coding(base: Assumptions) -> Assumptions:
    """The coding-assistant token shapes (`CODING`), figures scaled by the timing model."""
    return scaled(base, dataclasses.replace(base, **CODING))


def agent(base: Assumptions) -> Assumptions:
    """The agent token shapes (`AGENT`), figures scaled by the timing model."""
    return scaled(base, dataclasses.replace(base, **AGENT))


def cache_hit(base: Assumptions, hit: float) -> Assumptions:
    """The base with round(prompt x hit) cached tokens, figures scaled by the timing model.
    Raises PlanError (`--cache-hit`) unless 0 <= hit <= 1."""
    if not 0.0 <= hit <= 1.0:
        raise PlanError("--cache-hit", f"must be between 0 and 1, got {hit:g}")
    new = dataclasses.replace(base, cached_tokens=round(base.prompt_tokens * hit))
    return scaled(base, new)


FOLLOW_UPS: dict[str, Callable[[Assumptions], Assumptions]] = {
    "smaller model": smaller_model,
    "coding": coding,
    "agent": agent,
}
