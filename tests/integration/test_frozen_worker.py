"""A frozen worker (its process SIGSTOP'd: the TCP connection stays open, nothing comes back)
over real simulated worker processes: once the pool's probes mark it unhealthy, its open
Generate streams end at once with a transport failure (UNAVAILABLE), not after the channel's
keepalive (~50 s); thawed, it serves again. A worker that answers "unhealthy" while it visibly
decodes keeps its streams. Through the gateway, a stream on a frozen worker migrates to the
other one (`router.migrate_streams`) and completes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import replace

import aiohttp
import grpc
import pytest
from engine_fleet import Fleet
from helpers import eventually, own_app, post_fault
from structlog.testing import capture_logs

from homing.config import (
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    OutlierSettings,
    RouterSettings,
)
from homing.engines.client import EngineError, GenerateParams
from homing.engines.pool import PoolConfig, WorkerPool, WorkerState
from homing.router import Router

MODEL = "llama-3.1-8b"

#: Probes every 0.1 s with 0.2 s to answer; three counted timeouts mark it unhealthy, once
#: the last progress its KV stream showed is 0.5 s old.
CONFIG = PoolConfig(
    health_interval_s=0.1,
    health_timeout_s=0.2,
    unhealthy_threshold=3,
    healthy_threshold=2,
    progress_window_s=0.5,
    kv_backoff_initial_s=0.05,
    kv_backoff_max_s=0.5,
)


def _signal(fleet: Fleet, sig: signal.Signals, index: int = 0) -> None:
    """Send `sig` to every process group of worker `index` (the launcher's, the engine's)."""
    worker = fleet.workers[index]
    for pgid in sorted({worker.process.pid, worker.engine_pid} - {0}):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass


@pytest.fixture
def sim() -> Iterator[Fleet]:
    """One simulated worker process at 10x speed; thawed (SIGCONT) before it is stopped."""
    fleet = Fleet("sim")
    fleet.start(1)
    try:
        yield fleet
    finally:
        _signal(fleet, signal.SIGCONT)
        fleet.close()


@pytest.fixture
def sims() -> Iterator[Fleet]:
    """Two simulated worker processes at 10x speed; thawed before they are stopped."""
    fleet = Fleet("sim")
    fleet.start(2)
    try:
        yield fleet
    finally:
        for index in range(len(fleet.workers)):
            _signal(fleet, signal.SIGCONT, index)
        fleet.close()


async def test_a_frozen_workers_open_stream_ends_within_a_probe_of_it_turning_unhealthy(
    sim: Fleet,
) -> None:
    """SIGSTOP mid-stream: the stream raises EngineError(UNAVAILABLE, transport) well under
    a second after the pool marks the worker unhealthy, seconds after the freeze (the
    keepalive alone would take ~50 s); SIGCONT: healthy again, and it generates."""
    loop = asyncio.get_running_loop()
    unhealthy_at: list[float] = []

    def on_health(state: WorkerState) -> None:
        if not state.healthy:
            unhealthy_at.append(loop.time())

    pool = WorkerPool(sim.urls, router=Router(), config=CONFIG, on_health_change=on_health)
    await pool.start()
    try:
        await pool.wait_ready(5)
        w0 = pool.state("w0")
        params = GenerateParams(
            "frozen-1", list(range(1000, 1064)), max_new_tokens=50_000, ignore_eos=True
        )
        ended: asyncio.Future[tuple[float, BaseException | None]] = loop.create_future()

        async def consume() -> None:
            stream = pool.client("w0").generate(params, timeout_s=120)
            try:
                with pool.track("w0"):
                    async for _ in stream:
                        pass
                ended.set_result((loop.time(), None))
            except EngineError as err:
                ended.set_result((loop.time(), err))
            finally:
                await stream.aclose()

        task = asyncio.create_task(consume())
        # A second stream, read once and then left unread while the worker freezes.
        idle = pool.client("w0").generate(replace(params, request_id="frozen-idle"), timeout_s=120)
        await anext(idle)
        # It streams, and the engine's load records carry their non-evictable KV usage.
        assert await eventually(lambda: w0.load is not None and w0.load.running >= 1, 5.0)
        assert w0.load is not None and w0.load.active_token_usage is not None
        assert pool.client("w0").open_streams == 2
        frozen_at = loop.time()
        _signal(sim, signal.SIGSTOP)
        at, err = await asyncio.wait_for(asyncio.shield(ended), 10.0)
        assert isinstance(err, EngineError), err
        assert (err.code, err.transport) == (grpc.StatusCode.UNAVAILABLE, True)
        assert "stopped answering" in err.message
        assert unhealthy_at, "the stream ended before the pool marked the worker unhealthy"
        assert 0 <= at - unhealthy_at[0] < 1.0
        assert at - frozen_at < 5.0
        assert not w0.healthy and w0.in_flight == 0
        with pytest.raises(EngineError) as cut:  # the unread one fails on its next read
            await anext(idle)
        assert cut.value is not err and cut.value.code == grpc.StatusCode.UNAVAILABLE
        assert pool.client("w0").open_streams == 0
        await idle.aclose()
        await task

        _signal(sim, signal.SIGCONT)
        assert await eventually(lambda: w0.healthy, 10.0)
        short = GenerateParams("frozen-2", list(range(1000, 1032)), max_new_tokens=4)
        items = [item async for item in pool.client("w0").generate(short, timeout_s=10)]
        assert items and getattr(items[-1], "finish_reason", None) == "length"
    finally:
        await pool.stop()


async def test_one_probe_timeout_marks_a_frozen_worker_with_open_streams_unhealthy(
    sim: Fleet,
) -> None:
    """With a failure threshold no freeze reaches (100), the first probe that times out
    once its progress is older than the window marks it unhealthy (source "stalled") and
    its stream is cut: a stall is proven by a stream that should move and does not."""
    loop = asyncio.get_running_loop()
    pool = WorkerPool(sim.urls, router=Router(), config=replace(CONFIG, unhealthy_threshold=100))
    await pool.start()
    try:
        await pool.wait_ready(5)
        w0 = pool.state("w0")
        params = GenerateParams(
            "stall-1", list(range(1000, 1064)), max_new_tokens=50_000, ignore_eos=True
        )
        stream = pool.client("w0").generate(params, timeout_s=120)
        await anext(stream)
        assert await eventually(lambda: w0.last_progress_at is not None, 5.0)
        frozen_at = loop.time()
        with capture_logs() as logs:
            _signal(sim, signal.SIGSTOP)
            with pytest.raises(EngineError) as cut:
                async with asyncio.timeout(10.0):
                    async for _ in stream:
                        pass
        assert (cut.value.code, cut.value.transport) == (grpc.StatusCode.UNAVAILABLE, True)
        assert loop.time() - frozen_at < 5.0
        flips = [e for e in logs if e["event"] == "worker_health_changed"]
        assert [(e["healthy"], e["source"]) for e in flips] == [(False, "stalled")]
        assert w0.consecutive_failures < 100
        await stream.aclose()
    finally:
        await pool.stop()


async def test_a_stream_on_a_frozen_worker_migrates_and_completes_within_seconds(
    sims: Fleet,
) -> None:
    """Through the gateway with `migrate_streams`: the worker serving a stream is frozen
    after 3 text events; the gateway gets the transport failure once the pool marks it
    unhealthy and resumes on the other worker: the stream ends with `length`, no error
    event, seconds after the freeze, the request logged `ok` on the other worker."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            workers=sims.urls,
            health_interval_s=0.1,
            health_timeout_s=0.2,
            progress_window_s=0.5,
            outliers=OutlierSettings(enabled=False),
        ),
        router=RouterSettings(policy="consistent_hash", migrate_streams=True),
    )
    async with own_app(config) as app:
        assert app.pool is not None and app.model is not None
        body = {
            "model": MODEL,
            "prompt": app.model.tokenizer.encode("Tell me about frozen replicas."),
            "max_tokens": 40,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        headers = {"x-session-id": "frozen"}
        url = f"http://127.0.0.1:{app.http_port}/v1/completions"
        loop = asyncio.get_running_loop()
        async with aiohttp.ClientSession() as http:
            probe = {**body, "stream": False, "max_tokens": 1}
            async with http.post(url, json=probe, headers=headers) as resp:
                target_id = resp.headers["x-homing-worker"]
            index = [w.worker_id for w in app.pool.workers()].index(target_id)
            target, other = app.pool.workers()[index], app.pool.workers()[1 - index]
            await post_fault(target.url, {"slowdown": 200})  # tokens trickle out
            lines: list[bytes] = []
            with capture_logs() as logs:
                async with http.post(url, json=body, headers=headers) as resp:
                    assert resp.headers["x-homing-worker"] == target_id
                    texts = 0
                    while texts < 3:
                        line = await resp.content.readline()
                        assert line, "the stream ended before the freeze"
                        lines.append(line)
                        if line.startswith(b"data: {") and b'"text":""' not in line:
                            texts += 1
                    _signal(sims, signal.SIGSTOP, index)
                    frozen_at = loop.time()
                    lines.append(await asyncio.wait_for(resp.read(), 10.0))
                    ended_s = loop.time() - frozen_at
    events = [e for e in b"".join(lines).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert ended_s < 5.0, f"the stream took {ended_s:.1f} s after the freeze"
    assert [e["to_worker"] for e in logs if e["event"] == "request_migrated"] == [other.worker_id]
    done = [e for e in logs if e["event"] == "request_done"]
    assert [(e["outcome"], e["worker"]) for e in done] == [("ok", other.worker_id)]
    severed = [e for e in logs if e["event"] == "worker_streams_severed"]
    assert [e["worker"] for e in severed][:1] == [target_id]


async def test_a_worker_answering_unhealthy_while_it_decodes_keeps_its_streams(
    sim: Fleet,
) -> None:
    """`health: false` mid-stream, once the pool has seen the engine work: the worker leaves
    rotation (its probes count), but its load records keep showing progress, so its open
    stream is not cut and keeps flowing."""
    config = replace(CONFIG, progress_window_s=2.0)
    pool = WorkerPool(sim.urls, router=Router(), config=config)
    await pool.start()
    loop = asyncio.get_running_loop()
    try:
        await pool.wait_ready(5)
        w0 = pool.state("w0")
        params = GenerateParams(
            "decoding-1", list(range(1000, 1064)), max_new_tokens=50_000, ignore_eos=True
        )
        stream = pool.client("w0").generate(params, timeout_s=120)
        received = 0

        async def consume() -> None:
            nonlocal received
            async for _ in stream:
                received += 1

        task = asyncio.create_task(consume())
        try:

            def progressing() -> bool:
                last = w0.last_progress_at
                return last is not None and loop.time() - last < 0.5

            assert await eventually(progressing, 5.0)
            await post_fault(sim.urls[0], {"health": False})
            assert await eventually(lambda: not w0.healthy, 3.0)
            at_unhealthy = received
            assert await eventually(lambda: received > at_unhealthy + 100, 3.0)
            # three more counted probe failures while it decodes
            assert await eventually(lambda: w0.consecutive_failures >= 6, 3.0)
            assert not task.done() and not w0.healthy
            assert pool.client("w0").open_streams == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await stream.aclose()
    finally:
        await pool.stop()
