"""The worker pool: discovery, health probing, live load and in-flight accounting.

Rule of this package: every change to a worker's state happens in a synchronous method on
plain data, decided by the pure functions of `homing.engines.health`,
`homing.engines.kv_stream`, `homing.engines.breaker` and `homing.engines.lifecycle`; the
background tasks only do I/O (probe, stream) and hand the outcome to those methods. There
is no await between reading and writing a worker's state, so the event loop is the lock.

One module per job:
- `state`: the plain data (`PoolConfig`, `WorkerState`, `EngineLoadView`, `WorkerSpec`,
  `LeaseMark`, `WorkerRefused`, and `Worker`, the pool's own record of a worker: internal
  to this package, not re-exported).
- `membership`: `WorkerPool`, the public face: its workers' lifecycle (add, cordon, eject,
  drain, remove), its views and subscribers; it wires the jobs below together.
- `discovery`: what a worker serves, the check that it belongs, the pool's model facts.
- `health_loop`: per worker, every `health_interval_s`, `HealthCheck` with
  `health_timeout_s`; health changes, judged by progress; cutting a stopped worker's
  streams.
- `kv_loop`: per worker, its KV-event subscription, load records and index lifecycle.
- `leases`: in-flight counts, leases and the request-path circuit breakers.

Control loops of the pool (outlier ejection) run beside its tasks (`run_beside`), watch it
(`subscribe`) and move workers with `eject` / `readmit`.
"""

from __future__ import annotations

from homing.config.rules import check_worker_url
from homing.engines.pool.discovery import SGLANG_WINDOW_OVER_INPUT, served_name
from homing.engines.pool.kv_loop import DecodedKvBatch, KvEventSink
from homing.engines.pool.membership import WorkerPool
from homing.engines.pool.state import (
    EngineLoadView,
    LeaseMark,
    PoolConfig,
    TransitionHook,
    WorkerRefused,
    WorkerSpec,
    WorkerState,
)

__all__ = [
    "SGLANG_WINDOW_OVER_INPUT",
    "DecodedKvBatch",
    "EngineLoadView",
    "KvEventSink",
    "LeaseMark",
    "PoolConfig",
    "TransitionHook",
    "WorkerPool",
    "WorkerRefused",
    "WorkerSpec",
    "WorkerState",
    "check_worker_url",
    "served_name",
]
