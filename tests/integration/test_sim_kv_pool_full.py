"""A worker whose KV pool is far too small for its load: requests queue instead of failing, decode
retractions show in /metrics, and every request still completes with its whole answer."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker

POOL_TOKENS = 16 * 48  # 768 tokens: room for about three of the requests below at once
REQUESTS = 8
PROMPT_TOKENS = 64
ANSWER_TOKENS = 200


async def scrape(session: aiohttp.ClientSession, port: int) -> dict[str, float]:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    return {
        m.group(1): float(m.group(2))
        for m in (
            re.match(r"^([a-zA-Z_:]+)(?:\{[^}]*\})? (\S+)$", line) for line in text.splitlines()
        )
        if m
    }


async def test_a_full_kv_pool_queues_retracts_and_completes_every_request() -> None:
    """Eight concurrent requests need ~2,100 KV tokens from a 768-token pool: some wait in the
    queue, running ones are retracted when decode runs out, /metrics counts the retractions,
    and all eight finish with exactly their 200 tokens."""
    config = SimConfig(speedup=50.0, kv_capacity_tokens=POOL_TOKENS, max_running_requests=16)
    async with SimWorker(config) as worker, aiohttp.ClientSession() as http:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)

            async def one(i: int) -> tuple[int, str]:
                request = pb.GenerateRequest(
                    request_id=f"full-{i}",
                    tokenized=pb.TokenizedInput(
                        input_ids=list(range(10_000 * (i + 1), 10_000 * (i + 1) + PROMPT_TOKENS))
                    ),
                    sampling_params=pb.SamplingParams(
                        temperature=0, max_new_tokens=ANSWER_TOKENS, ignore_eos=True
                    ),
                    stream=True,
                )
                tokens = 0
                reason = ""
                async for response in stub.Generate(request, timeout=60):
                    if response.HasField("chunk"):
                        tokens += len(response.chunk.token_ids)
                    else:
                        reason = response.complete.finish_reason
                return tokens, reason

            tasks = [asyncio.create_task(one(i)) for i in range(REQUESTS)]
            max_queued = 0.0
            while not all(t.done() for t in tasks):
                values = await scrape(http, worker.metrics_port or 0)
                max_queued = max(max_queued, values["sglang:num_queue_reqs"])
                await asyncio.sleep(0.02)
            results = [t.result() for t in tasks]
            final = await scrape(http, worker.metrics_port or 0)
    assert results == [(ANSWER_TOKENS, "length")] * REQUESTS
    assert max_queued >= 1
    assert final["sglang:num_retracted_reqs_total"] >= 1
    assert final["sglang:num_requests_total"] == REQUESTS
    assert final["sglang:num_used_tokens"] == 0
