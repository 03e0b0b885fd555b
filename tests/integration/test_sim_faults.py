"""The simulated worker's HTTP sidecar over loopback: /metrics and every POST /fault action."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.ports import free_port_pair
from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker

CONFIG = SimConfig(speedup=20.0, heartbeat_busy_s=0.1, heartbeat_idle_s=0.2)


@pytest_asyncio.fixture
async def worker() -> AsyncIterator[SimWorker]:
    async with SimWorker(CONFIG) as sim:
        yield sim


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def stub_for(port: int) -> tuple[grpc.aio.Channel, pb_grpc.SglangSchedulerStub]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return channel, pb_grpc.SglangSchedulerStub(channel)


def gen_request(rid: str, prompt: list[int], max_new: int = 10) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True),
        stream=False,
    )


async def complete(
    stub: pb_grpc.SglangSchedulerStub, rid: str, prompt: list[int]
) -> pb.GenerateComplete:
    responses = [r async for r in stub.Generate(gen_request(rid, prompt), timeout=10)]
    return responses[-1].complete


async def metrics(http: aiohttp.ClientSession, worker: SimWorker) -> dict[str, float]:
    async with http.get(f"http://127.0.0.1:{worker.metrics_port}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    values = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:]+)(?:\{[^}]*\})? (\S+)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


async def post_fault(
    http: aiohttp.ClientSession, worker: SimWorker, body: object | str
) -> tuple[int, dict[str, object]]:
    url = f"http://127.0.0.1:{worker.metrics_port}/fault"
    data = body if isinstance(body, str) else None
    kwargs = {"data": data} if data is not None else {"json": body}
    async with http.post(url, **kwargs) as response:  # type: ignore[arg-type]
        return response.status, await response.json()


PROMPT = list(range(4000, 4100))


class TestSidecar:
    async def test_the_sidecar_listens_on_the_next_port_and_reports_sglang_metrics(
        self, worker: SimWorker, http: aiohttp.ClientSession
    ) -> None:
        """Metrics on port + 1 count the request, its prompt, generated and cached tokens."""
        assert worker.metrics_port == worker.port + 1
        channel, stub = stub_for(worker.port)
        async with channel:
            await complete(stub, "m1", PROMPT)
            await complete(stub, "m2", PROMPT)
        values = await metrics(http, worker)
        assert values["sglang:num_requests_total"] == 2
        assert values["sglang:prompt_tokens_total"] == 200
        assert values["sglang:generation_tokens_total"] == 20
        assert values["sglang:cached_tokens_total"] == 96
        assert values["sglang:cache_hit_rate"] == pytest.approx(96 / 200)
        assert values["sglang:num_running_reqs"] == 0
        assert values["sglang:num_retracted_reqs_total"] == 0
        assert values["sglang:max_total_num_tokens"] == worker.limits.kv_capacity_tokens
        assert values["homing_sim_up"] == 1

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ("{not json", "not valid JSON"),
            ("", "empty"),
            ({"slowdown": -1}, "'slowdown' must be"),
            ({"explode": True}, "unknown fault key"),
            ({"report_kv_usage": 1.5}, "'report_kv_usage' must be a number in [0, 1]"),
            ({"report_kv_usage": "full"}, "'report_kv_usage' must be a number in [0, 1]"),
        ],
    )
    async def test_a_bad_fault_body_is_a_400_with_a_clear_message(
        self, worker: SimWorker, http: aiohttp.ClientSession, body: object, message: str
    ) -> None:
        """Malformed JSON or an invalid fault answers 400 {"error": ...} and changes nothing."""
        status, answer = await post_fault(http, worker, body)
        assert status == 400
        assert message in str(answer["error"])
        assert worker.faults.slowdown == 1.0
        assert worker.faults.report_kv_usage is None


class TestStateFaults:
    async def test_slowdown_stretches_every_step_by_its_factor(
        self, worker: SimWorker, http: aiohttp.ClientSession
    ) -> None:
        """The same-shaped request accrues 3x the modelled wall time under {"slowdown": 3}."""
        channel, stub = stub_for(worker.port)
        async with channel:
            before = (await metrics(http, worker))["homing_sim_modeled_wall_seconds_total"]
            await complete(stub, "s1", list(range(10_000, 10_100)))
            normal = (await metrics(http, worker))["homing_sim_modeled_wall_seconds_total"] - before
            assert (await post_fault(http, worker, {"slowdown": 3}))[0] == 200
            await complete(stub, "s2", list(range(20_000, 20_100)))
            slowed = (
                (await metrics(http, worker))["homing_sim_modeled_wall_seconds_total"]
                - before
                - normal
            )
        assert slowed == pytest.approx(3 * normal, rel=0.05)

    async def test_a_stall_holds_tokens_and_health_until_it_ends(
        self, worker: SimWorker, http: aiohttp.ClientSession
    ) -> None:
        """During {"stall_s": 0.6} no token is produced and HealthCheck does not answer; after
        it, both resume."""
        channel, stub = stub_for(worker.port)
        async with channel:
            started = time.monotonic()
            assert (await post_fault(http, worker, {"stall_s": 0.6}))[0] == 200
            with pytest.raises(grpc.aio.AioRpcError) as probe:
                await stub.HealthCheck(pb.HealthCheckRequest(), timeout=0.2)
            assert probe.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            done = await complete(stub, "stalled", PROMPT)
            assert time.monotonic() - started >= 0.6
            assert done.completion_tokens == 10
            assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=2)).healthy

    async def test_health_false_is_reported_by_both_health_services_until_reset(
        self, worker: SimWorker, http: aiohttp.ClientSession
    ) -> None:
        """{"health": false} makes HealthCheck and grpc.health.v1 unhealthy while requests are
        still served; {} restores health."""
        channel, stub = stub_for(worker.port)
        async with channel:
            health = health_pb2_grpc.HealthStub(channel)
            await post_fault(http, worker, {"health": False})
            assert not (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=2)).healthy
            status = (await health.Check(health_pb2.HealthCheckRequest(), timeout=2)).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert (await complete(stub, "still", PROMPT)).completion_tokens == 10
            status_code, answer = await post_fault(http, worker, {})
            assert status_code == 200 and answer["faults"]["health"] is True  # type: ignore[index]
            assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=2)).healthy
            status = (await health.Check(health_pb2.HealthCheckRequest(), timeout=2)).status
            assert status == health_pb2.HealthCheckResponse.SERVING

    @pytest.mark.parametrize("code", ["UNAVAILABLE", "RESOURCE_EXHAUSTED"])
    async def test_reject_refuses_every_generate_with_that_status(
        self, worker: SimWorker, http: aiohttp.ClientSession, code: str
    ) -> None:
        """{"reject": CODE} answers Generate with CODE; {"reject": null} serves again."""
        channel, stub = stub_for(worker.port)
        async with channel:
            await post_fault(http, worker, {"reject": code})
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await complete(stub, "r1", PROMPT)
            assert refused.value.code() == grpc.StatusCode[code]
            await post_fault(http, worker, {"reject": None})
            assert (await complete(stub, "r2", PROMPT)).completion_tokens == 10

    async def test_report_kv_usage_replaces_the_usage_of_every_load_record(
        self, http: aiohttp.ClientSession
    ) -> None:
        """{"report_kv_usage": 0.99} makes the next load record (sent at once: heartbeats
        are 30 s apart here) and GetLoads report 0.99 while nothing runs; requests are
        still served; {"report_kv_usage": null} reports the real figure again."""
        quiet = SimConfig(speedup=20.0, heartbeat_busy_s=30.0, heartbeat_idle_s=30.0)
        async with SimWorker(quiet) as worker:
            channel, stub = stub_for(worker.port)
            async with channel:
                events = stub.SubscribeKvEvents(
                    common_pb2.SubscribeKvEventsRequest(
                        start_sequence_number=0, load_records_before_first_batch=True
                    ),
                    timeout=20,
                )
                records = aiter(events)
                first = await asyncio.wait_for(anext(records), 5)
                assert first.load.token_usage == 0.0
                status, answer = await post_fault(http, worker, {"report_kv_usage": 0.99})
                assert status == 200
                assert answer["faults"]["report_kv_usage"] == 0.99  # type: ignore[index]
                load = (await asyncio.wait_for(anext(records), 5)).load
                assert (load.token_usage, load.active_token_usage) == (0.99, 0.99)
                assert (load.running_requests, load.waiting_requests) == (0, 0)
                loads = await stub.GetLoads(pb.GetLoadsRequest(include=["all"]), timeout=2)
                assert loads.loads[0].token_usage == 0.99
                assert (await complete(stub, "full", PROMPT)).completion_tokens == 10
                await post_fault(http, worker, {"report_kv_usage": None})
                loads = await stub.GetLoads(pb.GetLoadsRequest(include=["all"]), timeout=2)
                assert loads.loads[0].token_usage < 0.99
                usage = [0.99]
                while usage[-1] == 0.99 and len(usage) < 50:  # the request's own records first
                    usage.append((await asyncio.wait_for(anext(records), 5)).load.token_usage)
                events.cancel()
            assert usage[-1] < 0.99
            assert worker.faults.report_kv_usage is None


class TestActions:
    async def test_restart_comes_back_on_the_same_port_empty_with_a_new_event_sequence(
        self, worker: SimWorker, http: aiohttp.ClientSession
    ) -> None:
        """After {"restart": true} the port serves again, the prompt is no longer cached, the
        event sequence starts at 1 again, and the restart is counted."""
        port = worker.port
        channel, stub = stub_for(port)
        async with channel:
            await complete(stub, "before", PROMPT)
            assert worker.hub.last_sequence_number >= 1
            status, answer = await post_fault(http, worker, {"restart": True})
            assert (status, answer["restarted"]) == (200, True)
        assert worker.port == port
        channel, stub = stub_for(port)
        async with channel:
            events = stub.SubscribeKvEvents(
                common_pb2.SubscribeKvEventsRequest(start_sequence_number=0), timeout=5
            )
            await events.initial_metadata()
            again = await complete(stub, "after", PROMPT)
            first_batch = await asyncio.wait_for(anext(aiter(events)), 5)
            events.cancel()
        assert again.cached_tokens == 0
        assert first_batch.sequence_number == 1
        assert (await metrics(http, worker))["homing_sim_restarts_total"] == 1

    async def test_clear_flushes_the_prefix_cache(
        self, worker: SimWorker, http: aiohttp.ClientSession
    ) -> None:
        """{"clear": true} drops the cache: a repeated prompt is no longer a hit."""
        channel, stub = stub_for(worker.port)
        async with channel:
            await complete(stub, "c1", PROMPT)
            assert (await complete(stub, "c2", PROMPT)).cached_tokens > 0
            status, answer = await post_fault(http, worker, {"clear": True})
            assert (status, answer["cleared"]) == (200, True)
            assert (await complete(stub, "c3", PROMPT)).cached_tokens == 0

    async def test_crash_takes_the_worker_and_its_sidecar_down_at_once(
        self, http: aiohttp.ClientSession
    ) -> None:
        """{"crash": true} answers 202, then the gRPC port and the sidecar stop answering and
        the worker reports the crash."""
        crashed: list[SimWorker] = []
        worker = SimWorker(CONFIG, on_crash=crashed.append)
        await worker.start()
        try:
            status, answer = await post_fault(http, worker, {"crash": True})
            assert (status, answer) == (202, {"crashing": True})
            for _ in range(100):
                if crashed:
                    break
                await asyncio.sleep(0.01)
            assert crashed == [worker] and worker.crashed
            channel, stub = stub_for(worker.port)
            async with channel:
                with pytest.raises(grpc.aio.AioRpcError) as down:
                    await stub.HealthCheck(pb.HealthCheckRequest(), timeout=1)
                assert down.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(aiohttp.ClientConnectionError):
                await metrics(http, worker)
        finally:
            await worker.stop(grace_s=0.1)


def test_a_free_port_pair_has_both_ports_free() -> None:
    """free_port_pair returns P with P and P + 1 bindable."""
    import socket

    port = free_port_pair("127.0.0.1")
    for candidate in (port, port + 1):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", candidate))
