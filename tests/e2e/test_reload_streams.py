"""A reload (SIGHUP) with 30 streams open changes tenants, a quota, the routing policy and
removes a worker: no stream is dropped, the new limits and keys apply to new requests, and
the removed worker drains (it finishes its streams, takes nothing new, then leaves)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engine_fleet import Fleet
from helpers import free_port, post_fault

pytestmark = pytest.mark.asyncio

STREAMS = 30
MAX_TOKENS = 3000  # a few seconds at the simulator's speedup 10
SLOWDOWN = 20  # while the reload is checked: 3000 tokens then last a minute or more
ACME, BETA = "sk-acme-0123456789", "sk-beta-0123456789"

CONFIG = """
[gateway]
port = {port}
grpc_port = {grpc_port}
[engines]
workers = {workers}
[router]
policy = "{policy}"
[admin]
state_dir = "{state}"
{tenants}
"""

TENANT = """
[[tenants]]
name = "{name}"
quota = {{ concurrent_streams = {streams} }}
[[tenants.keys]]
id = "{name}-key"
sha256 = "{sha}"
"""


def _tenant(name: str, key: str, streams: int) -> str:
    sha = hashlib.sha256(key.encode()).hexdigest()
    return TENANT.format(name=name, sha=sha, streams=streams)


@pytest.fixture
def sims() -> Iterator[Fleet]:
    fleet = Fleet("sim")
    fleet.start(3)
    yield fleet
    fleet.close()


async def _admin(state: Path, *verb: str) -> Any:
    """A `homing` admin verb's JSON output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "homing",
        *verb,
        "--admin",
        f"unix:{state}/admin.sock",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
    return json.loads(out)


async def _stream(http: aiohttp.ClientSession, url: str, i: int, opened: asyncio.Queue[str]):
    """One long stream: (worker, finish reason, completion tokens, saw [DONE], errors)."""
    body = {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": f"story number {i} " * 8}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {ACME}"}
    finish, tokens, done, errors = None, 0, False, []
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        worker = resp.headers["x-homing-worker"]
        first = True
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                continue
            event = json.loads(data)
            if "error" in event:
                errors.append(event["error"])
            for choice in event.get("choices", []):
                if first:
                    first = False
                    opened.put_nowait(worker)
                finish = choice.get("finish_reason") or finish
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return worker, finish, tokens, done, errors


@pytest.mark.timeout(240)
async def test_reload_under_thirty_streams_drops_none_and_applies_to_new_requests(
    tmp_path: Path, sims: Fleet
) -> None:
    port, state = free_port(), tmp_path / "state"
    urls = sims.urls
    fill = {"port": port, "grpc_port": free_port(), "state": state}
    config = tmp_path / "homing.toml"
    config.write_text(
        CONFIG.format(
            workers=json.dumps(urls),
            policy="cache_aware",
            tenants=_tenant("acme", ACME, 100),
            **fill,
        )
    )
    log = (tmp_path / "serve.log").open("w+")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "homing",
        "serve",
        "--config",
        str(config),
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as http:
            for _ in range(600):
                try:
                    async with http.get(f"{base}/ready") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            opened: asyncio.Queue[str] = asyncio.Queue()
            chat = f"{base}/v1/chat/completions"
            tasks = [asyncio.create_task(_stream(http, chat, i, opened)) for i in range(STREAMS)]
            on_worker = [await asyncio.wait_for(opened.get(), 60) for _ in range(STREAMS)]
            # Held open through the reload and its checks, however slow the host is: each
            # worker runs 20x slower until the checks are done, then at full speed again.
            for url in urls:
                await post_fault(url, {"slowdown": SLOWDOWN})
            # The worker to remove: one serving some of the open streams.
            workers = {w["url"]: w["id"] for w in (await _admin(state, "workers", "ls"))["workers"]}
            by_id = {v: k for k, v in workers.items()}
            victim = max(set(on_worker), key=on_worker.count)
            kept = [u for u in urls if u != by_id[victim]]

            # The reload: acme's stream quota falls to 30, tenant beta arrives, the policy
            # becomes round_robin, and the victim leaves the config.
            tenants = _tenant("acme", ACME, STREAMS) + _tenant("beta", BETA, 5)
            config.write_text(
                CONFIG.format(
                    workers=json.dumps(kept), policy="round_robin", tenants=tenants, **fill
                )
            )
            process.send_signal(signal.SIGHUP)
            for _ in range(300):
                log.seek(0)
                if '"event": "reload_applied"' in log.read():
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("no reload_applied in the log")
            assert not any(t.done() for t in tasks), "a stream ended before the checks"

            listed = {w["id"]: w for w in (await _admin(state, "workers", "ls"))["workers"]}
            assert listed[victim]["phase"] == "draining"
            assert listed[victim]["in_flight"] == on_worker.count(victim)
            (model,) = (await _admin(state, "models", "ls"))["models"]
            assert model["policy"] == "round_robin"

            # New requests: acme is at its new limit, beta's new key works, and nothing new
            # goes to the draining worker.
            small = {"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 4}
            async with http.post(
                f"{base}/v1/completions", json=small, headers={"Authorization": f"Bearer {ACME}"}
            ) as resp:
                assert resp.status == 429
                error = (await resp.json())["error"]
                assert error["code"] == "rate_limit_exceeded"
                assert "on tenant acme: Limit 30, Used 30, Requested 1" in error["message"]
            for _ in range(6):
                async with http.post(
                    f"{base}/v1/completions",
                    json=small,
                    headers={"Authorization": f"Bearer {BETA}"},
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    assert resp.headers["x-homing-worker"] != victim
            for url in urls:
                await post_fault(url, {"slowdown": 1})

            results = await asyncio.gather(*tasks)
            for _worker, finish, tokens, done, errors in results:
                assert (finish, tokens, done, errors) == ("length", MAX_TOKENS, True, [])
            assert sum(1 for r in results if r[0] == victim) == on_worker.count(victim)
            # The drained worker has left the pool once its streams ended.
            for _ in range(100):
                ids = {w["id"] for w in (await _admin(state, "workers", "ls"))["workers"]}
                if victim not in ids:
                    break
                await asyncio.sleep(0.1)
            assert victim not in ids
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 60) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
