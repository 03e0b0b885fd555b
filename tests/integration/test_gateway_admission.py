"""The admission queue on a running gateway: when the only replica is at its threshold,
requests wait instead of piling onto it, are admitted by priority and in tenant turns, and
are refused with 503 + Retry-After when the queue (or a tenant's share) is full or the wait
times out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers import eventually, own_app

from homing.app import App
from homing.config import (
    AdmissionSettings,
    GatewaySettings,
    HomingConfig,
    SimSettings,
    TenantSettings,
)
from homing.gateway.auth import hash_key

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _tenant(name: str, priority: int = 0) -> TenantSettings:
    return TenantSettings.model_validate(
        {
            "name": name,
            "priority": priority,
            "keys": [{"id": name, "sha256": hash_key(f"sk-{name}")}],
        }
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """One simulated replica that counts as overloaded with one request in flight; a queue
    of 4 with 2 per tenant and a 1 s wait."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        sim=SimSettings(workers=1, speedup=10.0),
        tenants=[
            _tenant("hog"),
            _tenant("b"),
            _tenant("c"),
            _tenant("vip", priority=5),
            TenantSettings.model_validate(
                {
                    "name": "rpm3",
                    "keys": [{"id": "rpm3", "sha256": hash_key("sk-rpm3")}],
                    "quota": {"requests_per_minute": 3},
                }
            ),
        ],
        admission=AdmissionSettings(
            max_in_flight_per_replica=1,
            max_queued=4,
            max_queued_per_tenant=2,
            queue_timeout_s=1.0,
            retry_after_s=2,
        ),
    )
    async with own_app(config) as running:
        yield running


async def _complete(app: App, tenant: str) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/completions",
            json={"model": app.model.model_id, "prompt": [5, 6, 7], "max_tokens": 2},  # type: ignore[union-attr]
            headers={"Authorization": f"Bearer sk-{tenant}"},
        ) as resp:
            return resp.status, json.loads(await resp.read()), resp.headers.copy()


class Hog:
    """A long stream that keeps the replica at its threshold until `stop`."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{self.app.http_port}/v1/completions",
                json={
                    "model": self.app.model.model_id,  # type: ignore[union-attr]
                    "prompt": [1, 2, 3],
                    "max_tokens": 50_000,
                    "ignore_eos": True,
                    "stream": True,
                },
                headers={"Authorization": "Bearer sk-hog"},
            ) as resp:
                assert resp.status == 200
                await resp.content.readline()
                self.started.set()
                await self.release.wait()  # leaving the block disconnects

    async def __aenter__(self) -> Hog:
        await asyncio.wait_for(self.started.wait(), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await self.task


def _no_capacity(message: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": "service_unavailable_error",
            "param": None,
            "code": "no_capacity",
        }
    }


async def test_queued_requests_are_admitted_by_priority_then_tenant_turns(app: App) -> None:
    """With the replica busy, b, b, c and a priority-5 tenant queue; a third b and a fifth
    request are refused with 503; once the replica frees they run vip, b, c, b."""
    assert app.admission is not None
    queue = app.admission.queue
    order: list[str] = []
    results: dict[str, int] = {}

    async def run(name: str, tenant: str) -> None:
        status, _, _ = await _complete(app, tenant)
        results[name] = status
        order.append(name)

    async with Hog(app):
        loop = asyncio.get_running_loop()
        tasks = []
        for count, (name, tenant) in enumerate(
            [("b1", "b"), ("b2", "b"), ("c1", "c"), ("vip1", "vip")], start=1
        ):
            tasks.append(loop.create_task(run(name, tenant)))
            assert await eventually(lambda n=count: len(queue) == n, 5)
        status, body, headers = await _complete(app, "b")
        assert (status, headers["Retry-After"]) == (503, "2")
        assert body == _no_capacity(
            f"Every replica of model '{app.model.model_id}' is overloaded and your "  # type: ignore[union-attr]
            "requests already fill your share of the admission queue (2); retry later."
        )
        status, body, headers = await _complete(app, "c")
        assert (status, headers["Retry-After"]) == (503, "2")
        assert body == _no_capacity(
            f"Every replica of model '{app.model.model_id}' is overloaded and the "  # type: ignore[union-attr]
            "admission queue is full; retry later."
        )
        assert order == []  # nobody was pushed onto the busy replica
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == ["vip1", "b1", "c1", "b2"]
    assert set(results.values()) == {200}


async def test_wait_past_the_queue_timeout_is_503(app: App) -> None:
    """A request still queued after `queue_timeout_s` (1 s) gets 503 with Retry-After."""
    async with Hog(app):
        status, body, headers = await _complete(app, "c")
    assert (status, headers["Retry-After"]) == (503, "2")
    assert body == _no_capacity(
        f"Every replica of model '{app.model.model_id}' is overloaded; the request "  # type: ignore[union-attr]
        "waited 1 s in the admission queue without a replica freeing up. Retry later."
    )
    assert app.gateway_metrics.value("homing_admission_rejected_total", reason="timeout") == 1


async def test_no_capacity_rejections_do_not_use_up_the_request_quota(app: App) -> None:
    """With 3 requests per minute, three 503s from a full replica leave all 3 for later."""
    async with Hog(app):
        results = await asyncio.gather(*(_complete(app, "rpm3") for _ in range(3)))
        assert [status for status, _, _ in results] == [503, 503, 503]
    for _ in range(3):
        status, body, _ = await _complete(app, "rpm3")
        assert status == 200, body
