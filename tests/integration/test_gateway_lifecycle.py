"""Lifecycle: drain on stop (in-flight streams finish, new calls refused on both APIs), gRPC
health following the pool, and a busy port reported before any worker starts."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import eventually, own_app

from homing.app import App
from homing.clock import ManualClock
from homing.config import EngineSettings, GatewaySettings, HomingConfig, SimSettings
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc


def _config(port: int = 0) -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=port, grpc_port=0, drain_timeout_s=10.0),
        engines=EngineSettings(health_interval_s=0.1, unhealthy_threshold=2),
        sim=SimSettings(workers=1, speedup=10.0),
    )


@pytest_asyncio.fixture
async def app() -> AsyncIterator[App]:
    """A fresh App on a `ManualClock` over one simulated worker, with health probes every
    0.1 s of its time."""
    app = own_app(_config(), clock=ManualClock())
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def test_stop_drains_streams_and_refuses_new_calls(app: App) -> None:
    """While stopping, an open HTTP stream runs to its end, and new HTTP and gRPC calls are
    refused."""
    model = app.model.model_id
    body = {"model": model, "prompt": "Go", "max_tokens": 400, "ignore_eos": True, "stream": True}
    grpc_port = app.grpc_port
    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"http://127.0.0.1:{app.http_port}/v1/completions", json=body)
        await resp.content.readline()
        stopping = asyncio.create_task(app.stop())
        assert app.service is not None
        service = app.service
        assert await eventually(lambda: not service.accepting, 5)  # the drain has begun
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            call = pb_grpc.InferenceStub(channel).Completion(
                pb.CompletionRequest(model=model, text="x"), timeout=2
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        rest = (await resp.read()).decode()
        assert rest.rstrip().endswith("data: [DONE]")
        await stopping


async def test_grpc_health_follows_worker_health(app: App) -> None:
    """When the only worker dies, its exit is logged, /ready is 503 and gRPC health is
    NOT_SERVING."""
    from structlog.testing import capture_logs

    assert app.sims is not None
    with capture_logs() as logs:
        app.sims.children[0].process.kill()
        assert isinstance(app.clock, ManualClock)  # its health probes run as it moves
        assert await eventually(
            lambda: not app.pool.healthy_workers(), within_s=5.0, clock=app.clock
        )
        assert await eventually(
            lambda: any(e["event"] == "sim_worker_exited" for e in logs), within_s=5.0
        )
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{app.http_port}/ready") as resp:
            assert resp.status == 503
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def not_serving() -> bool:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""))
            return reply.status == health_pb2.HealthCheckResponse.NOT_SERVING

        for _ in range(50):
            if await not_serving():
                break
            await asyncio.sleep(0.05)
        assert await not_serving()


async def test_busy_port_fails_before_starting_workers() -> None:
    """A port already in use is reported by address, and no simulated worker is left behind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = own_app(_config(port=port))
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            await app.start()
        assert app.sims is None


async def test_stream_cut_by_a_dying_worker_ends_with_an_error_event(app: App) -> None:
    """A worker killed mid-stream gives the client an error event and `[DONE]`, and the request
    is logged as failed, not as closed by the client."""
    from structlog.testing import capture_logs

    assert app.sims is not None
    model = app.model.model_id
    body = {"model": model, "prompt": "Go", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            resp = await session.post(f"http://127.0.0.1:{app.http_port}/v1/completions", json=body)
            await resp.content.readline()
            app.sims.children[0].process.kill()
            text = (await resp.read()).decode()
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2]
    done = [entry for entry in logs if entry["event"] == "request_done"]
    assert [entry["outcome"] for entry in done] == ["engine_error"]
    assert app.service.in_flight == 0
    assert all(w.in_flight == 0 for w in app.pool.workers())
