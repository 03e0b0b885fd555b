"""Test doubles for code that drives a served model. Nothing here is used by the running
gateway.

- `dispatch_over`: a `ModelDispatch` over in-process `homing.engines.testing.FakeEngine`s,
  as `homing.app` builds one over real workers (a `Router`, a `WorkerPool` that discovers
  every engine, the tokenizer from the engines' bundle), started on entry and stopped on
  exit:

      async with dispatch_over({"w0": FakeEngine(), "w1": FakeEngine()}) as built:
          lease = built.dispatch.lease(prompt_ids)

  Each key is the worker id the pool gives that engine. The pool's waits run on the given
  clock (default a `ManualClock`, so probes and KV backoffs wait for `advance`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from homing.clock import Clock, ManualClock
from homing.engines.pool import PoolConfig, WorkerPool, WorkerSpec, WorkerState
from homing.engines.testing import ClientFactory, FakeEngine, client_factory
from homing.fleet.dispatch import Admitter, ModelDispatch
from homing.router import Router
from homing.text.tokenizer import TextTokenizer, tokenizer_from_bundle


@functools.lru_cache(maxsize=4)
def _kept_tokenizer(bundle: bytes) -> TextTokenizer:
    """The process's shared tokenizer of `bundle` (`tokenizer_from_bundle`), kept alive for
    the test process, so that dispatches built one after another share one."""
    return tokenizer_from_bundle(bundle)


class _WorkerNames:
    """The pool's `new_id`: the given names in order, then "w0", "w1", ... not yet used."""

    def __init__(self, first: Iterable[str]) -> None:
        self._first = deque(first)
        self._used = set(self._first)
        self._numbers = itertools.count()

    def __call__(self) -> str:
        if self._first:
            return self._first.popleft()
        while True:
            name = f"w{next(self._numbers)}"
            if name not in self._used:
                self._used.add(name)
                return name


@dataclass
class BuiltDispatch:
    """What `dispatch_over` built: the `dispatch` facade, its `pool` and `router`, the
    `clock` they wait on, and `engines` by worker id (those added later included)."""

    dispatch: ModelDispatch
    pool: WorkerPool
    router: Router
    clock: Clock
    _clients: ClientFactory

    @property
    def engines(self) -> dict[str, FakeEngine]:
        """Every engine the pool was given, by worker id (a live dict)."""
        return self._clients.engines

    async def add(
        self, engine: FakeEngine, *, version: str = "", warm: bool = False
    ) -> WorkerState:
        """Add `engine` to the running pool (`WorkerPool.add`; its id is the next free
        "wN"); returns its state once discovery answered. Raises as `WorkerPool.add`."""
        self._clients.add(engine)
        return await self.pool.add(WorkerSpec(engine.url, version, warm=warm))


@contextlib.asynccontextmanager
async def dispatch_over(
    engines: Mapping[str, FakeEngine],
    *,
    clock: Clock | None = None,
    policy: str = "cache_aware",
    model: str | None = None,
    admission: Admitter | None = None,
    **pool_settings: Any,
) -> AsyncIterator[BuiltDispatch]:
    """A started `ModelDispatch` over `engines` (worker id -> engine, in pool order), its
    pool stopped (`WorkerPool.stop`) on exit.

    `clock`: what the pool and router wait on and read (default a fresh `ManualClock`).
    `policy`: the router's policy name. `model`: the served model name the pool requires
    (default the first engine's `model`). `admission`: the model's admission queue.
    `pool_settings`: `PoolConfig` fields (e.g. `unhealthy_threshold=10`). The router's block
    size is the first engine's page size; the tokenizer is loaded from the first engine's
    bundle. On entry every engine has been discovered (joined; refused and gone; or left
    `joining` when not `reachable`) and every joined engine's KV-event subscription is open.
    Raises ValueError for no engines, TypeError for an unknown pool setting.
    """
    if not engines:
        raise ValueError("dispatch_over needs at least one engine")
    clock = clock if clock is not None else ManualClock()
    first = next(iter(engines.values()))
    clients = client_factory(engines.values())
    router = Router(policy, block_size=first.page_size, clock=clock)
    pool = WorkerPool(
        [engine.url for engine in engines.values()],
        router=router,
        model=model if model is not None else first.model,
        clock=clock,
        config=PoolConfig(**pool_settings),
        new_id=_WorkerNames(engines),
        client_factory=clients,
        wall_clock=clock.wall,
    )
    try:
        await pool.start()
        for state in pool.workers():
            if state.discovered:
                await clients.engines[state.worker_id].kv_subscribed()
        dispatch = ModelDispatch(
            pool.served_model_name,
            _kept_tokenizer(first.tokenizer_zip),
            pool,
            router,
            admission=admission,
            created=int(clock.wall()),
        )
        yield BuiltDispatch(dispatch, pool, router, clock, clients)
    finally:
        await pool.stop()
