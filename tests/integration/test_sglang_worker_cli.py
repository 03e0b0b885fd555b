"""`homing worker` with real SGLang (tiny model, CPU): one ready line, a serving worker, and a
clean stop of SGLang's whole process group on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import pytest
from sglang_env import SGLANG_PYTHON, TINY_MODEL, fast_start_env, require_sglang

from homing.engines.client import EngineClient
from homing.engines.sglang_launch import group_members


@pytest.mark.timeout(300)
async def test_worker_announces_serves_and_stops_its_group_on_sigterm() -> None:
    """The ready line names a URL that answers HealthCheck; SIGTERM ends the command with
    exit 0 within 30 s and leaves no live process in SGLang's process group."""
    require_sglang()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "homing", "worker",
        "--model", str(TINY_MODEL), "--python", str(SGLANG_PYTHON),
        "--port", "0", "--device", "cpu",
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
        env={**os.environ, **fast_start_env()},
    )  # fmt: skip
    assert process.stdout is not None
    pgid = 0
    try:
        began = time.monotonic()
        line = await asyncio.wait_for(process.stdout.readline(), timeout=280)
        assert line, f"homing worker exited with {await process.wait()} before it was ready"
        print(f"worker ready after {time.monotonic() - began:.1f} s", file=sys.stderr)
        ready = json.loads(line)
        assert ready["event"] == "ready"
        (worker,) = ready["workers"]
        assert worker["url"] == f"grpc://127.0.0.1:{worker['port']}"
        assert worker["kv_events"].startswith("tcp://127.0.0.1:")
        pgid = worker["pid"]
        assert pgid in group_members(pgid)  # SGLang leads a process group of its own
        client = EngineClient(worker["url"], worker_id="w0")
        try:
            assert await client.health_check(timeout_s=30)
        finally:
            await client.close()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0
        assert group_members(pgid) == []
        assert await process.stdout.read() == b""  # nothing but the ready line on stdout
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)  # the worker stops SGLang's group itself
            try:
                await asyncio.wait_for(process.wait(), timeout=30)
            except TimeoutError:
                process.kill()
                await process.wait()
        if pgid and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)
