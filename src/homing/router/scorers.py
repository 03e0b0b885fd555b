"""Scorers: small pure functions, each mapping one worker property to a score in [0, 1].

Rule of this file: higher is better, every score is in [0, 1], each formula is in its
docstring, and nothing here knows about other scorers or weights (the policy weighs them).
Shape follows the llm-d inference scheduler (filters -> weighted scorers -> picker).
"""

from __future__ import annotations

from homing.router.types import WorkerSnapshot


def prefix_score(matched_tokens: int, prompt_tokens: int) -> float:
    """Share of the prompt the worker already holds: `matched / prompt` (0 for an empty prompt).

    Prefill cost on a hit falls with exactly this share (the cached tokens are not recomputed).
    """
    if prompt_tokens <= 0:
        return 0.0
    return min(1.0, max(0.0, matched_tokens / prompt_tokens))


def load_score(load: int, max_load: int, load_floor: int) -> float:
    """Relative idleness: `1 - load / max(max_load, load_floor)`, clamped to [0, 1].

    `load` and `max_load` (the largest load among the candidates) are in requests
    (`WorkerSnapshot.load`). `load_floor` keeps small absolute differences at low load from
    swinging the score over its whole range (1 request vs 0 is not "fully loaded vs idle").
    """
    denominator = max(max_load, load_floor, 1)
    return min(1.0, max(0.0, 1.0 - load / denominator))


def kv_score(worker: WorkerSnapshot) -> float:
    """KV headroom: `1 - token_usage` (token_usage in [0, 1], evictable prefix cache excluded)."""
    return min(1.0, max(0.0, 1.0 - worker.token_usage))
