"""Scorers: the terms of the one scoring rule (`homing.router.cost`), one pure function per
file, each with its formula and unit in its docstring. Every term is a cost in prompt-token
equivalents (lower is better); the weights live in `CostWeights`."""

from __future__ import annotations

from homing.router.scorers.decode import decode_load
from homing.router.scorers.prefill import uncached_prefill_tokens
from homing.router.scorers.queue import queued_prefill_tokens

__all__ = ["decode_load", "queued_prefill_tokens", "uncached_prefill_tokens"]
