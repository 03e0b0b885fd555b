"""`homing worker` with real SGLang (tiny model, CPU), as the session fleet started it: one
ready line, a serving worker, and a clean stop of SGLang's whole process group on SIGTERM.

The test stops a session worker, so it runs after every other test (`stops_session_fleet`);
a later user of the fleet would get that worker started again (`Fleet.ensure_running`)."""

from __future__ import annotations

import asyncio

import pytest
from engine_fleet import Fleet

from homing.engines.client import EngineClient
from homing.engines.sglang_launch import group_members


async def _healthy(url: str) -> bool:
    client = EngineClient(url, worker_id="w0")
    try:
        return await client.health_check(timeout_s=30)
    finally:
        await client.close()


@pytest.mark.timeout(360)  # may start the session fleet, or a worker of it again
@pytest.mark.stops_session_fleet
def test_worker_announces_serves_and_stops_its_group_on_sigterm(sglang_fleet: Fleet) -> None:
    """The ready line names a URL that answers HealthCheck and SGLang's KV event endpoint;
    SGLang leads a process group of its own; SIGTERM ends the command with exit 0 within
    30 s, leaves no live process in that group, and nothing but the ready line was printed
    on stdout."""
    sglang_fleet.ensure_running()
    index = len(sglang_fleet.workers) - 1
    worker = sglang_fleet.workers[index]
    assert worker.ready["event"] == "ready"
    (announced,) = worker.ready["workers"]
    assert announced["url"] == f"grpc://127.0.0.1:{announced['port']}"
    assert announced["kv_events"].startswith("tcp://127.0.0.1:")
    pgid = announced["pid"]
    assert pgid in group_members(pgid)
    assert asyncio.run(_healthy(announced["url"]))

    assert sglang_fleet.stop(index, timeout_s=30.0) == 0
    assert group_members(pgid) == []
    assert worker.later_output == []
