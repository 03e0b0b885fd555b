"""Engines: the SGLang gRPC client and the worker pool (discovery, health, live load)."""

from __future__ import annotations

from homing.engines.client import (
    EngineClient,
    EngineError,
    GenerateDone,
    GenerateParams,
    TokenChunk,
)
from homing.engines.pool import EngineLoadView, PoolConfig, WorkerPool, WorkerState

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineLoadView",
    "GenerateDone",
    "GenerateParams",
    "PoolConfig",
    "TokenChunk",
    "WorkerPool",
    "WorkerState",
]
