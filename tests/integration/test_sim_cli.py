"""`homing sim` as a real process: one ready line, serving workers, clean exit on signals."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import aiohttp
import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

ENTRY = (
    "import argparse, sys\n"
    "from homing.sim.main import add_sim_arguments, run_sim\n"
    "p = argparse.ArgumentParser()\n"
    "add_sim_arguments(p)\n"
    "sys.exit(run_sim(p.parse_args(sys.argv[1:])))\n"
)


async def start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ENTRY,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )


async def test_sim_prints_one_ready_line_serves_and_exits_cleanly_on_sigterm() -> None:
    """Two workers on free ports announce themselves in one JSON line, answer HealthCheck,
    and the process exits 0 on SIGTERM."""
    process = await start("--workers", "2", "--port", "0", "--speedup", "10")
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        ready = json.loads(line)
        assert ready["event"] == "ready"
        ports = [w["port"] for w in ready["workers"]]
        assert len(set(ports)) == 2
        for worker in ready["workers"]:
            assert worker["url"] == f"grpc://127.0.0.1:{worker['port']}"
            async with grpc.aio.insecure_channel(f"127.0.0.1:{worker['port']}") as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)).healthy
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
        assert await process.stdout.read() == b""  # nothing but the ready line on stdout
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_sim_exits_on_sigint_too() -> None:
    """Ctrl-C stops a worker process with exit status 0."""
    process = await start("--workers", "1")
    try:
        assert process.stdout is not None
        json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=30))
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_bad_option_exits_2_with_a_message() -> None:
    """An unknown model preset is reported on stderr, before any ready line."""
    process = await start("--model", "gpt-5")
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 2
    assert stdout == b""
    assert b"unknown model" in stderr


async def test_the_ready_line_names_each_workers_sidecar_port() -> None:
    """Each worker's entry carries metrics_port = port + 1, and that port serves /metrics."""
    process = await start("--workers", "2", "--port", "0")
    try:
        assert process.stdout is not None
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=30))
        for worker in ready["workers"]:
            assert worker["metrics_port"] == worker["port"] + 1
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{worker['metrics_port']}/metrics"
                async with http.get(url) as response:
                    assert "sglang:num_running_reqs" in await response.text()
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=10)


async def test_the_process_exits_1_when_its_only_worker_crashes() -> None:
    """An injected crash of the last worker ends the process with status 1 within seconds."""
    process = await start("--workers", "1")
    try:
        assert process.stdout is not None
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=30))
        port = ready["workers"][0]["metrics_port"]
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/fault"
            async with http.post(url, json={"crash": True}) as response:
                assert response.status == 202
        assert await asyncio.wait_for(process.wait(), timeout=5) == 1
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_perf_prints_one_json_object_with_the_calibrated_figures() -> None:
    """`homing sim perf` for 70B on 8x H100 prints prefill_ms, decode_step_ms and
    kv_capacity_tokens inside issue 3's bands."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "homing",
        "sim",
        "perf",
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "H100",
        "--tp",
        "8",
        "--prefill",
        "8192",
        "--batch",
        "80",
        "--context",
        "1800",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0
    lines = stdout.decode().splitlines()
    assert len(lines) == 1
    figures = json.loads(lines[0])
    assert 14_000 <= 8192 / (figures["prefill_ms"] / 1e3) <= 20_000
    assert 30 <= figures["decode_step_ms"] <= 50
    assert 1_100_000 < figures["kv_capacity_tokens"] < 1_400_000


async def test_a_startup_delay_holds_the_ready_line_and_sigterm_in_it_exits_0() -> None:
    """`--startup-delay-s 1.5` (an emulated cold start): no ready line for 1.5 s, then one;
    a SIGTERM during another process's delay exits 0 before any ready line."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    process = await start("--workers", "1", "--port", "0", "--startup-delay-s", "1.5")
    waiting = await start("--workers", "1", "--port", "0", "--startup-delay-s", "60")
    try:
        assert process.stdout is not None and waiting.stdout is not None
        ready = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=30))
        assert ready["event"] == "ready" and loop.time() - began >= 1.5
        waiting.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(waiting.wait(), timeout=10) == 0
        assert await waiting.stdout.read() == b""
    finally:
        for p in (process, waiting):
            if p.returncode is None:
                p.kill()
                await p.wait()


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
async def test_a_bad_startup_delay_exits_2_with_a_message(value: str) -> None:
    process = await start("--startup-delay-s", value)
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    assert (process.returncode, stdout) == (2, b"")
    assert b"--startup-delay-s must be a finite number >= 0" in stderr
