"""The per-worker circuit breaker over simulated worker processes: a half-open worker takes
exactly one lease at a time (virtual clock) and its trial closes the breaker at the worker's
first token, mid-stream; a trial the client leaves or the worker aborts before a token counts
neither way and frees the slot; a worker that refuses connections opens its breaker and a
half-open trial closes it once the worker is back; a worker that passes its probes but
refuses every Generate stays out, re-opening with a doubled interval."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
import pytest_asyncio
from engine_fleet import Fleet as ProcessFleet
from helpers import eventually, own_app, post_fault
from stream_load import StreamLoad
from structlog.testing import capture_logs

from homing.clock import ManualClock
from homing.config import (
    BreakerSettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    SimSettings,
)
from homing.engines.client import EngineClient, EngineError, GenerateDone, GenerateParams
from homing.engines.pool import PoolConfig, WorkerPool
from homing.fleet import ModelDispatch
from homing.fleet.dispatch import NoReplica
from homing.router import Router
from homing.sim.process import spawn_sim, terminate
from homing.text.tokenizer import TextTokenizer

MODEL = "llama-3.1-8b"
REFUSED = EngineError(grpc.StatusCode.UNAVAILABLE, "connection refused")


@pytest_asyncio.fixture
async def sim_url() -> AsyncIterator[str]:
    args = ["--workers", "1", "--port", "0", "--speedup", "10", "--parent-pid", str(os.getpid())]
    process, ready = await spawn_sim(args)
    yield ready["workers"][0]["url"]
    await terminate([process], 2.0)


async def test_a_half_open_worker_takes_exactly_one_lease_at_a_time(sim_url: str) -> None:
    """Open: no lease. Past 1 s of virtual time: one lease (the trial); a second is
    refused while it is out; the trial ends well: closed, leases flow again."""
    clock = ManualClock()
    router = Router(clock=clock)
    # Health tolerates the failures here, so only the breaker keeps the worker out.
    config = PoolConfig(unhealthy_threshold=10)
    pool = WorkerPool([sim_url], router=router, clock=clock, config=config)
    await pool.start()
    try:
        tokenizer = TextTokenizer.from_bundle(await pool.tokenizer_bundle())
        model = ModelDispatch(pool.served_model_name, tokenizer, pool, router)
        for _ in range(5):
            model.report_failure("w0", REFUSED)
        w0 = pool.state("w0")
        assert w0.breaker == "open"
        with pytest.raises(NoReplica):
            model.lease([1, 2, 3])
        clock.advance(1.0)
        assert w0.breaker == "half_open"
        trial = model.lease([1, 2, 3])
        with pytest.raises(NoReplica):
            model.lease([4, 5, 6])  # the trial slot is taken
        trial.release()  # no stream sent: no outcome, the slot is free again
        assert (w0.breaker, w0.breaker_trial) == ("half_open", False)
        trial = model.lease([1, 2, 3])
        stream = trial.client.generate(long_generation("trial"), timeout_s=30)
        try:
            await anext(stream)  # the worker's first answer closes it, mid-stream
            assert w0.breaker == "closed"
            with model.lease([1, 2, 3]), model.lease([4, 5, 6]):
                pass
        finally:
            await stream.aclose()
            trial.release()
        assert w0.breaker == "closed"
    finally:
        await pool.stop()


def long_generation(request_id: str) -> GenerateParams:
    """A generation that runs for seconds at the simulator's speed."""
    return GenerateParams(request_id, list(range(1000, 1064)), max_new_tokens=50_000)


async def test_a_trial_the_client_leaves_before_its_first_token_counts_neither_way(
    sim_url: str,
) -> None:
    """Half-open, the trial's client goes away before the worker answers (its stream closed
    at once): no success, no failure; the breaker stays half-open with its slot free, and
    the next lease is the trial. One that answers then completes closes it."""
    clock = ManualClock()
    router = Router(clock=clock)
    pool = WorkerPool(
        [sim_url], router=router, clock=clock, config=PoolConfig(unhealthy_threshold=10)
    )
    await pool.start()
    try:
        tokenizer = TextTokenizer.from_bundle(await pool.tokenizer_bundle())
        model = ModelDispatch(pool.served_model_name, tokenizer, pool, router)
        for _ in range(5):
            model.report_failure("w0", REFUSED)
        clock.advance(1.0)
        w0 = pool.state("w0")
        with model.lease([1, 2, 3]) as trial:
            stream = trial.client.generate(long_generation("left"), timeout_s=30)
            await stream.aclose()  # the client left before any token
        assert (w0.breaker, w0.breaker_trial, w0.breaker_opens) == ("half_open", False, 1)
        with model.lease([1, 2, 3]) as trial:
            assert w0.breaker_trial
            short = GenerateParams("done", [1000, 1001, 1002], max_new_tokens=2)
            items = [item async for item in trial.client.generate(short, timeout_s=30)]
            assert w0.breaker == "closed" and items
    finally:
        await pool.stop()


async def test_a_trial_the_worker_aborts_before_answering_counts_neither_way(
    sim_url: str,
) -> None:
    """Half-open, the worker aborts the trial (its stream ends with finish_reason "abort",
    no token): no success, no failure; the slot is free for the next trial."""
    clock = ManualClock()
    router = Router(clock=clock)
    pool = WorkerPool(
        [sim_url], router=router, clock=clock, config=PoolConfig(unhealthy_threshold=10)
    )
    await pool.start()
    try:
        tokenizer = TextTokenizer.from_bundle(await pool.tokenizer_bundle())
        model = ModelDispatch(pool.served_model_name, tokenizer, pool, router)
        for _ in range(5):
            model.report_failure("w0", REFUSED)
        clock.advance(1.0)
        w0 = pool.state("w0")
        await post_fault(sim_url, {"stall_s": 60.0})  # no token before the abort
        with model.lease([1, 2, 3]) as trial:
            stream = trial.client.generate(long_generation("aborted-trial-1"), timeout_s=30)
            first = asyncio.create_task(anext(stream))
            await _until_the_worker_holds_a_request(pool.client("w0"))
            # An Abort of a prefix ends the request's stream with "abort" (SGLang's rule):
            # an empty chunk, then the complete message.
            await pool.client("w0").abort("aborted-trial")
            await post_fault(sim_url, {"stall_s": 0.0})
            items = [await first, *[item async for item in stream]]
            last = items[-1]
            assert isinstance(last, GenerateDone) and last.finish_reason == "abort"
            assert not any(item.token_ids for item in items)
            assert (w0.breaker, w0.breaker_trial) == ("half_open", True)
        assert (w0.breaker, w0.breaker_trial, w0.breaker_opens) == ("half_open", False, 1)
    finally:
        await pool.stop()


async def _until_the_worker_holds_a_request(client: EngineClient) -> None:
    """Poll GetLoads until the worker has a running or waiting request (at most 10 s)."""
    async with asyncio.timeout(10.0):
        while True:
            load = (await client.loads()).loads[0]
            if load.num_running_reqs + load.num_waiting_reqs > 0:
                return
            await asyncio.sleep(0.01)


LONG_STREAM = 1024  # tokens: about a second per stream at 10x speed


@pytest.fixture
def workers() -> Iterator[ProcessFleet]:
    """Two simulated worker processes at 10x speed."""
    fleet = ProcessFleet("sim")
    fleet.start(2)
    try:
        yield fleet
    finally:
        fleet.close()


def served(workers: list[str]) -> HomingConfig:
    """The listed workers; breakers open at 3 failures (health's own threshold, which takes
    a dead worker out after as many, so the requests in flight on it are all it fails)."""
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            workers=workers, health_interval_s=0.2, breaker=BreakerSettings(consecutive=3)
        ),
    )


async def test_the_breaker_opens_on_a_worker_that_refuses_connections_and_closes_after_restart(
    workers: ProcessFleet,
) -> None:
    """Killed with 4 streams in flight on it, w1's requests fail at once: its breaker opens.
    Restarted on its port, w1 is probed healthy, its half-open trial succeeds, and the
    breaker closes; w1 serves again.

    The streams are 1,024 tokens (about a second at 10x speed): the gateway's count of
    streams in flight lags the worker, and streams of 64 tokens could end on the worker
    between the check and the kill under a loaded run, leaving fewer than 3 to fail; health,
    counting the probes' failures too, then took w1 out with its breaker still closed."""
    async with own_app(served(workers.urls)) as app:
        assert app.pool is not None
        w0, w1 = app.pool.workers()
        with capture_logs() as logs:
            async with StreamLoad(
                app.http_port or 0, model=MODEL, concurrency=8, max_tokens=LONG_STREAM
            ) as load:
                assert await eventually(lambda: load.by_worker[w1.worker_id] >= 4, 10.0)
                assert await eventually(lambda: w1.in_flight >= 4, 5.0)
                workers.kill(1)
                assert await eventually(lambda: w1.breaker == "open", 5.0)
                assert not w1.routable
                killed_for = time.monotonic()
                await asyncio.to_thread(workers.restart, 1)
                restarted_at = time.monotonic()
                assert await eventually(lambda: w1.breaker == "closed" and w1.routable, 15.0)
                closed_s = time.monotonic() - restarted_at
                before = load.by_worker[w1.worker_id]
                assert await eventually(lambda: load.by_worker[w1.worker_id] > before, 10.0)
        print(f"down {restarted_at - killed_for:.1f} s; closed {closed_s:.1f} s after restart")
        changes = [(e["before"], e["state"]) for e in logs if e["event"] == "worker_breaker"]
        assert changes[0] == ("closed", "open")
        assert changes[-1] == ("half_open", "closed")
        assert w1.breaker_opens >= 1
        assert w0.breaker == "closed" and w0.breaker_opens == 0
        registry = app.gateway_metrics.registry
        labels = {"model": MODEL, "worker": w1.worker_id}
        assert (registry.get_sample_value("homing_worker_breaker_opens_total", labels) or 0) >= 1
        state = registry.get_sample_value(
            "homing_worker_breaker_state", {**labels, "state": "closed"}
        )
        assert state == 1.0


async def test_a_worker_refusing_every_generate_but_passing_probes_stays_out() -> None:
    """`reject: UNAVAILABLE` while HealthCheck passes: health alone would bring w0 back
    after two probes, the breaker keeps it out, one trial per open interval (1 s, 2 s,
    4 s); once it serves again, the next trial closes the breaker."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(health_interval_s=0.2, breaker=BreakerSettings(consecutive=3)),
        sim=SimSettings(workers=2, speedup=10.0),
    )
    async with own_app(config) as app:
        assert app.pool is not None
        w0, w1 = app.pool.workers()
        async with StreamLoad(app.http_port or 0, model=MODEL, concurrency=4) as load:
            assert await eventually(lambda: load.by_worker[w0.worker_id] >= 3, 10.0)
            await post_fault(w0.url, {"reject": "UNAVAILABLE"})
            assert await eventually(lambda: w0.breaker_opens >= 3, 15.0)
            assert w0.healthy or await eventually(lambda: w0.healthy, 2.0)  # probes pass
            served_before = load.ok
            await asyncio.sleep(1.0)
            assert load.ok > served_before  # w1 serves
            await post_fault(w0.url, {"reject": None})
            assert await eventually(lambda: w0.breaker == "closed" and w0.routable, 15.0)
            before = load.by_worker[w0.worker_id]
            assert await eventually(lambda: load.by_worker[w0.worker_id] > before, 10.0)
        assert w1.breaker_opens == 0
