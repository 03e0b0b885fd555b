"""Conformance of the simulated worker against the real SGLang Model Gateway (`smg`, PyPI 1.13.0).

smg is an implementation of SGLang's gRPC protocol that nobody here wrote: it registers the
workers (GetModelInfo / GetServerInfo), fetches the tokenizer (GetTokenizer), subscribes to KV
events and loads (SubscribeKvEvents), probes health and streams Generate. Two simulated workers
run as their own `homing sim` processes (so one can crash alone) behind
`smg launch --policy cache_aware --block-size 16`, and the test checks what a client of smg
sees: 200s carrying the simulated text, streamed and not; a repeated long prompt routed by
smg's event-driven cache-aware branch (`smg_cache_aware_policy_branch_total{branch="event_hit"}`)
and answered with cached tokens; and, after one worker crashes, every request answered through
the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from homing.ports import free_port_pair
from homing.sim.generation import CORPUS
from homing.sim.process import spawn_sim, terminate

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"
LONG_PROMPT = " ".join(f"section {i}: the router keeps this conversation warm" for i in range(120))


def smg_binary() -> str:
    """The `smg` console script of this environment (installed by the `test` extra)."""
    beside = Path(sys.executable).parent / "smg"
    found = str(beside) if beside.exists() else shutil.which("smg")
    if found is None:
        pytest.fail("smg is not installed: `pip install -e '.[test]'` (or `make test`) brings it")
    return found


@dataclass
class SimProcess:
    process: asyncio.subprocess.Process
    port: int
    metrics_port: int


@dataclass
class Stack:
    sims: list[SimProcess]
    smg: asyncio.subprocess.Process
    base_url: str
    prometheus_url: str
    log_path: Path
    http: aiohttp.ClientSession

    def log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines[-30:])


async def start_sim() -> SimProcess:
    process, ready = await spawn_sim(
        ["--workers", "1", "--port", "0", "--speedup", "20"],
        stderr=asyncio.subprocess.DEVNULL,
        timeout_s=30,
    )
    worker = ready["workers"][0]
    return SimProcess(process, worker["port"], worker["metrics_port"])


async def stop_process(process: asyncio.subprocess.Process) -> None:
    await terminate([process], grace_s=10)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[Stack]:
    """smg on free ports in front of two simulated workers, ready (both workers healthy)."""
    binary = smg_binary()
    sims = list(await asyncio.gather(start_sim(), start_sim()))
    port = free_port_pair("127.0.0.1")
    log_dir = Path(tempfile.mkdtemp(prefix="smg-conformance-"))
    log_path = log_dir / "smg.log"
    with log_path.open("wb") as log:
        smg = await asyncio.create_subprocess_exec(
            binary,
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *(f"grpc://127.0.0.1:{sim.port}" for sim in sims),
            "--policy",
            "cache_aware",
            "--block-size",
            "16",
            "--prometheus-port",
            str(port + 1),
            "--shutdown-grace-period-secs",
            "1",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
        )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        stack = Stack(
            sims,
            smg,
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{port + 1}/metrics",
            log_path,
            http,
        )
        try:
            await wait_ready(stack)
            yield stack
        finally:
            await stop_process(smg)
            await asyncio.gather(*(stop_process(sim.process) for sim in sims))
            shutil.rmtree(log_dir, ignore_errors=True)


async def wait_ready(stack: Stack, within_s: float = 60.0) -> None:
    """Until smg reports both workers healthy and serves the model."""
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if stack.smg.returncode is not None:
            pytest.fail(f"smg exited with {stack.smg.returncode}:\n{stack.log_tail()}")
        with contextlib.suppress(aiohttp.ClientError):
            async with stack.http.get(f"{stack.base_url}/readiness") as response:
                if response.status == 200 and (await response.json()).get("healthy_workers") == 2:
                    async with stack.http.get(f"{stack.base_url}/v1/models") as models:
                        if MODEL in {m["id"] for m in (await models.json())["data"]}:
                            return
        await asyncio.sleep(0.1)
    pytest.fail(f"smg did not become ready:\n{stack.log_tail()}")


async def prometheus(stack: Stack) -> str:
    async with stack.http.get(stack.prometheus_url) as response:
        return await response.text()


def series(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def sim_metric(stack: Stack, sim: SimProcess, name: str) -> float:
    async with stack.http.get(f"http://127.0.0.1:{sim.metrics_port}/metrics") as response:
        return series(await response.text(), name)


async def chat(stack: Stack, content: str, *, stream: bool, max_tokens: int = 24) -> dict:
    """One chat completion through smg; streamed answers are reassembled."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    url = f"{stack.base_url}/v1/chat/completions"
    async with stack.http.post(url, json=body) as response:
        if response.status != 200:
            raise AssertionError(f"{response.status}: {await response.text()}")
        if not stream:
            answer = await response.json()
            return {
                "content": answer["choices"][0]["message"]["content"],
                "usage": answer["usage"],
                "finish_reason": answer["choices"][0]["finish_reason"],
            }
        content_parts: list[str] = []
        usage: dict = {}
        finish = None
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data:") :])
            for choice in event.get("choices", []):
                content_parts.append(choice.get("delta", {}).get("content") or "")
                finish = choice.get("finish_reason") or finish
            usage = event.get("usage") or usage
        return {"content": "".join(content_parts), "usage": usage, "finish_reason": finish}


def looks_simulated(text: str) -> bool:
    """The simulated worker answers with sentences of its own corpus."""
    return any(text.startswith(sentence[:12]) for sentence in CORPUS)


async def test_smg_serves_the_simulated_text_streamed_and_not(stack: Stack) -> None:
    """Through smg, a chat completion is a 200 whose text is the simulated answer, and the
    streamed answer to the same greedy prompt is the same text."""
    plain = await chat(stack, "Say hello to the gateway.", stream=False)
    streamed = await chat(stack, "Say hello to the gateway.", stream=True)
    assert looks_simulated(plain["content"]), plain
    assert streamed["content"] == plain["content"]
    assert plain["usage"]["completion_tokens"] > 0
    assert streamed["finish_reason"] in {"stop", "length"}


async def test_a_repeated_long_prompt_takes_smgs_event_hit_branch_and_reports_cached_tokens(
    stack: Stack,
) -> None:
    """After the first long request's KV events reach smg, the same prompt is routed by the
    event-driven cache-aware branch (event_hit) and answered with cached tokens."""
    first = await chat(stack, LONG_PROMPT, stream=False)
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens > 600
    # smg applies the first request's stored blocks (one per full 16-token page) from the
    # KV-event stream; wait until it has them instead of sleeping.
    deadline = asyncio.get_running_loop().time() + 10
    while series(await prometheus(stack), "smg_kv_event_blocks_total", op="stored") < (
        prompt_tokens // 16
    ):
        assert asyncio.get_running_loop().time() < deadline, stack.log_tail()
        await asyncio.sleep(0.05)
    hits_before = series(
        await prometheus(stack), "smg_cache_aware_policy_branch_total", branch="event_hit"
    )
    second = await chat(stack, LONG_PROMPT, stream=True)
    hits_after = series(
        await prometheus(stack), "smg_cache_aware_policy_branch_total", branch="event_hit"
    )
    assert hits_after >= hits_before + 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["content"] == first["content"]


async def test_after_a_worker_crash_smg_answers_every_request_through_the_other(
    stack: Stack,
) -> None:
    """The worker holding the long prompt's cache crashes; smg still answers every request,
    streamed and not, and the survivor serves them all."""
    cached = [await sim_metric(stack, sim, "sglang:cached_tokens_total") for sim in stack.sims]
    victim, survivor = (
        (stack.sims[0], stack.sims[1]) if cached[0] >= cached[1] else stack.sims[::-1]
    )
    async with stack.http.post(
        f"http://127.0.0.1:{victim.metrics_port}/fault", json={"crash": True}
    ) as response:
        assert response.status == 202
    assert await asyncio.wait_for(victim.process.wait(), timeout=10) == 1
    served_before = await sim_metric(stack, survivor, "sglang:num_requests_total")
    prompts = [LONG_PROMPT, "A short question.", LONG_PROMPT, "Another one.", LONG_PROMPT, "Bye."]
    answers = [await chat(stack, p, stream=i % 2 == 0) for i, p in enumerate(prompts)]
    assert all(looks_simulated(a["content"]) for a in answers), answers
    served_after = await sim_metric(stack, survivor, "sglang:num_requests_total")
    assert served_after - served_before >= len(prompts)
