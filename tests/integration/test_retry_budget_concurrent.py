"""Failures that arrive together cannot overspend the retry budget: each retry is reserved
at the moment it is decided, before the failed attempt is torn down."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
from helpers import own_app, post_fault

from homing.clock import ManualClock
from homing.config import HomingConfig, RouterSettings

pytestmark = pytest.mark.asyncio


async def test_thirty_simultaneous_refusals_make_only_the_one_retry_the_budget_allows(
    retry_config: Callable[[RouterSettings], HomingConfig],
) -> None:
    router = RouterSettings(
        policy="round_robin",
        max_retries=1,
        retry_budget_ratio=0.0,
        retry_min_per_s=0.1,
        retry_window_s=10.0,  # a floor of 0.1/s over 10 s: exactly one retry
    )
    async with own_app(retry_config(router), clock=ManualClock()) as app:
        assert app.pool is not None
        for w in app.pool.workers():
            await post_fault(w.url, {"reject": "UNAVAILABLE"})
        url = f"http://127.0.0.1:{app.http_port}/v1/completions"
        async with aiohttp.ClientSession() as http:

            async def one(i: int) -> int:
                body = {"model": "llama-3.1-8b", "prompt": f"q{i}", "max_tokens": 4}
                async with http.post(url, json=body) as resp:
                    await resp.read()
                    return resp.status

            statuses = await asyncio.gather(*(one(i) for i in range(30)))
        metrics = app.gateway_metrics
        retried = metrics.value("homing_retries_total", model="llama-3.1-8b", outcome="retried")
        refused = metrics.value(
            "homing_retries_total", model="llama-3.1-8b", outcome="budget_exhausted"
        )
    assert set(statuses) == {503}
    assert retried == 1
    assert refused == 29
