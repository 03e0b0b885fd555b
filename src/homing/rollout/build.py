"""The rollout controller of a `homing serve` process, from its config.

The store is a Redis hash when `quotas.backend` is "redis" (every instance on that Redis
shares it; `quotas.redis_url` and `quotas.key_prefix`), else `rollouts.json` in the state
directory (`admin.state_dir`, homing.config.default_state_dir).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from homing.clock import Clock
from homing.config import HomingConfig, default_state_dir
from homing.fleet import Fleet
from homing.obs.requests import RequestRecorder
from homing.rollout.controller import RolloutController, config_of
from homing.rollout.metrics import RolloutMetrics
from homing.rollout.store import FileStore, RedisStore, RolloutStore


def build_store(cfg: HomingConfig, *, state_dir: str | None = None) -> tuple[RolloutStore, Any]:
    """The store the config names, and the Redis client it made (None for the file; the
    caller closes it with `aclose`). The file store lives in `state_dir` (default
    `default_state_dir(admin.state_dir)`)."""
    q = cfg.quotas
    if q.backend == "redis":
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(q.redis_url)
        return RedisStore(client, q.key_prefix), client
    return FileStore(state_dir or default_state_dir(cfg.admin.state_dir)), None


def build_controller(
    cfg: HomingConfig,
    fleet: Fleet,
    recorder: RequestRecorder,
    registry: CollectorRegistry,
    store: RolloutStore,
    clock: Clock | None = None,
) -> RolloutController:
    """A controller over `fleet` with each model's configured split, fed by `recorder`'s
    ended requests and failed attempts, exporting on `registry`, on `clock` (default
    `SystemClock`)."""
    # The fleet holds the served models in config order.
    splits = {
        model_id: spec.versions
        for spec, model_id in zip(cfg.served_models(), fleet.models, strict=True)
    }
    controller = RolloutController(
        fleet,
        config_of(cfg.rollout, cfg.gateway.request_timeout_s),
        store,
        config_splits=splits,
        metrics=RolloutMetrics(registry),
        clock=clock,
    )
    recorder.on_done.append(controller.record)
    recorder.on_failed_attempt.append(controller.record_failed_attempt)
    return controller
