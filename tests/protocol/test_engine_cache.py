"""The engines' own KV events drive routing, on the simulator and on real SGLang: a prompt's
blocks reach the affinity index, its repeat goes to the worker holding them and is served from
its cache, a prefix the engine evicts loses its credit while the prefixes it keeps still
route to it, and a worker killed with SIGKILL and started again loses its index entries and
gets no credit for prefixes it no longer holds."""

from __future__ import annotations

import asyncio
import uuid

import aiohttp
import pytest
from engine_fleet import SMALL_POOL_TOKENS, EngineWorker, Fleet
from helpers import eventually

from homing.app import App
from homing.engines.client import EngineClient, GenerateDone, GenerateParams

pytestmark = pytest.mark.asyncio(loop_scope="module")

BLOCK = 16  # the router's block size = the engines' page size


def _prompt(app: App, blocks: int) -> list[int]:
    """A fresh prompt of at least `blocks` full blocks (a random tag keeps it unseen)."""
    assert app.service is not None
    tokenizer = app.model.tokenizer
    text = f"{uuid.uuid4().hex} " + "the quick brown fox jumps over the lazy dog " * blocks * 2
    ids = tokenizer.encode_plain(text)
    assert len(ids) >= blocks * BLOCK
    return ids[: blocks * BLOCK + 5]


async def _complete(app: App, prompt: list[int]) -> tuple[str, int]:
    """POST a completion; (the worker that served it, its cached prompt tokens)."""
    assert app.pool is not None
    body = {
        "model": app.pool.served_model_name,
        "prompt": prompt,
        "max_tokens": 2,
        "temperature": 0,
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{app.http_port}/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            answer = await r.json()
            worker = r.headers["x-homing-worker"]
    details = answer["usage"].get("prompt_tokens_details") or {}
    return worker, int(details.get("cached_tokens") or 0)


def _matched(app: App, prompt: list[int]) -> dict[str, int]:
    assert app.router is not None
    return dict(app.router.index.match(prompt))


async def test_a_repeated_prompt_goes_to_its_holder_and_hits_its_cache(gateway: App) -> None:
    """The engine's stored events put the prompt's full blocks in the index under the worker
    that served it; the repeat is routed there and reports cached tokens (whole blocks)."""
    prompt = _prompt(gateway, blocks=6)
    first, cached = await _complete(gateway, prompt)
    assert cached == 0
    full = (len(prompt) // BLOCK) * BLOCK
    assert await eventually(lambda: _matched(gateway, prompt).get(first, 0) >= full - BLOCK, 10)
    for _ in range(3):
        again, cached = await _complete(gateway, prompt)
        assert again == first
        assert cached >= full - BLOCK and cached % BLOCK == 0


async def test_a_killed_and_restarted_worker_has_no_stale_credit(
    gateway: App, fleet: Fleet
) -> None:
    """SIGKILL the worker holding a prefix: its index entries are flushed (its event stream
    dropped) and it turns unhealthy; started again on its port it serves again, the index
    credits it with nothing until it stores anew, and what it stores next reaches the index
    again. (Real SGLang's event stream sends nothing until its first event, so the stream
    reads "connecting" until then.)"""
    assert gateway.pool is not None and gateway.router is not None
    pool, index = gateway.pool, gateway.router.index
    prompt = _prompt(gateway, blocks=4)
    holder, _ = await _complete(gateway, prompt)
    assert await eventually(lambda: index.worker_blocks(holder) > 0, 10)
    position = [w.worker_id for w in pool.workers()].index(holder)
    epoch = pool.state(holder).kv_epoch

    await asyncio.to_thread(fleet.kill, position)
    assert await eventually(lambda: index.worker_blocks(holder) == 0, 10)
    assert await eventually(lambda: not pool.state(holder).healthy, 30)
    assert holder not in _matched(gateway, prompt)

    worker = await asyncio.to_thread(fleet.restart, position)
    assert await eventually(lambda: pool.state(holder).healthy, 60), pool.state(holder)
    assert pool.state(holder).kv_epoch > epoch
    assert holder not in _matched(gateway, prompt)

    # Its KV events reach the index again: a prompt it stores is credited to it (tried a few
    # times: what it stores before the resubscription reaches the worker is not replayed).
    for _ in range(5):
        fresh = _prompt(gateway, blocks=3)
        await _engine_generate(worker.url, fresh)
        if await eventually(lambda p=fresh: _matched(gateway, p).get(holder, 0) >= 2 * BLOCK, 3):
            break
    else:
        raise AssertionError(f"no stored event reached the index: {pool.state(holder)}")
    assert pool.state(holder).kv_stream == "open"


@pytest.mark.timeout(600)  # may start the session fleet (300 s), and a worker of its own
async def test_an_evicted_prefix_loses_its_credit_and_a_kept_one_still_routes(
    small_pool_gateway: App, small_pool_worker: EngineWorker
) -> None:
    """A worker whose KV pool is full evicts its least recently used prefix A and publishes
    `removed` for its pages: the index then credits A to no worker, and the engine itself
    reports nothing of A cached where it reported all of A's blocks before; prefix B, used
    after each prompt that filled the pool, is kept, still credited to that worker, routed
    to it and served from its cache. A repeat of A through homing is served with what the
    index credits its worker with (nothing), and A stored again is credited again."""
    app = small_pool_gateway
    assert app.pool is not None and app.router is not None
    url = small_pool_worker.url
    small = next(w.worker_id for w in app.pool.workers() if w.url == url)

    # The worker's stored events reach the index (tried a few times: what it stores before
    # homing's subscription reaches the engine is not replayed).
    for _ in range(5):
        warm = _prompt(app, blocks=2)
        await _engine_generate(url, warm)
        if await eventually(lambda p=warm: _matched(app, p).get(small, 0) == 2 * BLOCK, 3):
            break
    else:
        raise AssertionError(f"no stored event reached the index: {app.pool.state(small)}")

    # A, then B, sent to the small worker directly, credited to it alone, then routed to it
    # by homing and served whole from its cache (B last: A is now its least recently used).
    full = 6 * BLOCK
    a, b = _prompt(app, blocks=6), _prompt(app, blocks=6)
    for prompt in (a, b):
        done = await _engine_generate(url, prompt)
        assert done.cached_tokens == 0
        assert await eventually(lambda p=prompt: _matched(app, p) == {small: full}, 10)
        assert await _complete(app, prompt) == (small, full)

    # Fill the pool: each filler needs about half of it, so the second cannot fit beside A,
    # B and the first (LRU evicts the warm-up prompt, then A), and B, used after each, stays
    # the most recent.
    filler_blocks = SMALL_POOL_TOKENS // BLOCK // 2 - 2
    for _ in range(3):
        done = await _engine_generate(url, _prompt(app, blocks=filler_blocks))
        assert done.cached_tokens == 0
        assert await _complete(app, b) == (small, full)
    assert await eventually(lambda: _matched(app, a) == {}, 10), _matched(app, a)
    assert _matched(app, b) == {small: full}

    # homing's repeat of A: the engine that served it reports nothing cached, as the index
    # credits it with nothing.
    worker, cached = await _complete(app, a)
    assert cached == 0, worker
    if worker != small:  # the engine's own word: it no longer holds A
        assert (await _engine_generate(url, a)).cached_tokens == 0
    # A, stored anew on the small worker, is credited to it again and routed by its credit.
    assert await eventually(lambda: _matched(app, a).get(small) == full, 10), _matched(app, a)
    worker, cached = await _complete(app, a)
    assert (cached, _matched(app, a).get(worker)) == (full, full)


async def _engine_generate(url: str, prompt: list[int]) -> GenerateDone:
    """One short greedy generation sent to the worker directly (not through homing)."""
    client = EngineClient(url, worker_id="direct")
    try:
        params = GenerateParams(
            request_id=f"direct-{uuid.uuid4().hex}",
            input_ids=prompt,
            max_new_tokens=1,
            temperature=0.0,
            stream=False,
        )
        items = [item async for item in client.generate(params)]
        assert items and isinstance(items[-1], GenerateDone), items
        return items[-1]
    finally:
        await client.close()
