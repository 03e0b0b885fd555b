"""Lost affinity shows as load and as a dip in the cache hit ratio on /metrics, through the
whole gateway over real simulated workers (child processes): multi-turn conversations run
warm, one worker restarts (sidecar fault), the conversations it held miss on their next turn
and hit again on the one after."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from helpers import eventually, own_app, post_fault
from prometheus_client.parser import text_string_to_metric_families

from homing.app import App
from homing.config import EngineSettings, GatewaySettings, HomingConfig, SimSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONVERSATIONS = 8
BASE_TOKENS = 512
TURN_TOKENS = 128
SERIES = (
    "homing_request_cached_tokens_sum",
    "homing_request_prompt_tokens_sum",
    "homing_request_prompt_tokens_count",
    "homing_router_cached_tokens_total",
    "homing_router_prefill_tokens_total",
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """Two simulated workers at 20x speed with fast health probes."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(health_interval_s=0.1, unhealthy_threshold=2),
        sim=SimSettings(workers=2, speedup=20.0),
    )
    async with own_app(config) as running:
        yield running


def prompt(conversation: int, turn: int) -> list[int]:
    """Turn `turn` (1-based) of a conversation: its own 512-token opening plus 128 tokens a
    turn, so each turn's prompt extends the previous one."""
    start = 20_000 + conversation * 4_000
    return list(range(start, start + BASE_TOKENS + TURN_TOKENS * (turn - 1)))


async def scrape(session: aiohttp.ClientSession, app: App) -> dict[str, float]:
    """The SERIES samples of GET /metrics, each summed over its label sets."""
    async with session.get(f"http://127.0.0.1:{app.http_port}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    sums = dict.fromkeys(SERIES, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums


async def run_turn(session: aiohttp.ClientSession, app: App, turn: int) -> dict[int, str]:
    """Every conversation's `turn`, concurrently; conversation -> serving worker. Returns
    once /metrics has counted every request of the turn."""
    assert app.model is not None
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    before = (await scrape(session, app))["homing_request_prompt_tokens_count"]

    async def one(c: int) -> tuple[int, str]:
        body = {
            "model": app.model.model_id,  # type: ignore[union-attr]
            "prompt": prompt(c, turn),
            "max_tokens": 4,
            "ignore_eos": True,
            "user": f"conversation-{c}",
        }
        async with session.post(url, json=body) as resp:
            await resp.read()
            assert resp.status == 200
            return c, resp.headers["x-homing-worker"]

    served = dict(await asyncio.gather(*(one(c) for c in range(CONVERSATIONS))))
    counted: list[float] = []

    async def poll() -> None:
        counted.append((await scrape(session, app))["homing_request_prompt_tokens_count"])

    for _ in range(200):
        await poll()
        if counted[-1] >= before + CONVERSATIONS:
            break
        await asyncio.sleep(0.01)
    assert counted[-1] == before + CONVERSATIONS
    return served


def ratios(a: dict[str, float], b: dict[str, float]) -> tuple[float, float, float]:
    """Between scrapes a and b: the engines' hit ratio (cached / prompt tokens of ended
    requests), the router's expected hit ratio and its expected prefill tokens."""
    prompt_tokens = b["homing_request_prompt_tokens_sum"] - a["homing_request_prompt_tokens_sum"]
    cached = b["homing_request_cached_tokens_sum"] - a["homing_request_cached_tokens_sum"]
    expected_hit = b["homing_router_cached_tokens_total"] - a["homing_router_cached_tokens_total"]
    prefill = b["homing_router_prefill_tokens_total"] - a["homing_router_prefill_tokens_total"]
    return cached / prompt_tokens, expected_hit / (expected_hit + prefill), prefill


async def test_hit_ratio_dips_after_a_restart_and_recovers(app: App) -> None:
    """Warm turns hit (> 0.75 of prompt tokens cached, by the engines and by the router's
    expectation); right after the worker holding most conversations restarts, the next turn
    hits at most half as much and the router expects the lost tokens as prefill; the turn
    after that is warm again."""
    pool, router = app.pool, app.router
    assert pool is not None and router is not None
    async with aiohttp.ClientSession() as session:
        await run_turn(session, app, 1)  # cold openings
        await run_turn(session, app, 2)
        warm_from = await scrape(session, app)
        served = await run_turn(session, app, 3)
        warm = ratios(warm_from, await scrape(session, app))

        victim, held = Counter(served.values()).most_common(1)[0]
        state = pool.state(victim)
        epoch = state.kv_epoch
        await post_fault(state.url, {"restart": True})
        assert await eventually(lambda: pool.state(victim).kv_epoch > epoch, 5)
        assert await eventually(
            lambda: pool.state(victim).routable and pool.state(victim).kv_stream == "open", 5
        )
        assert router.index.worker_blocks(victim) == 0

        dip_from = await scrape(session, app)
        await run_turn(session, app, 4)
        dip = ratios(dip_from, await scrape(session, app))
        recover_from = await scrape(session, app)
        await run_turn(session, app, 5)
        recovered = ratios(recover_from, await scrape(session, app))

    engine_warm, router_warm, prefill_warm = warm
    engine_dip, router_dip, prefill_dip = dip
    engine_back, router_back, _ = recovered
    assert engine_warm > 0.75 and router_warm > 0.75
    assert held >= CONVERSATIONS // 2
    # the victim's conversations (at least half) lost their whole cached prefix
    assert engine_dip <= engine_warm / 2 + 0.05
    assert router_dip <= router_warm / 2 + 0.05
    lost = held * len(prompt(0, 3))  # the victim's hits of turn 3 are now prefill
    assert prefill_dip >= prefill_warm + lost
    assert engine_back > 0.75 and router_back > 0.75
