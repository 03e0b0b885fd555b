"""An instant worker (`SimConfig.instant`, `homing sim --instant`): zero-time steps, SGLang's
framing kept, one chunk per step however far behind the client is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest_asyncio
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.sim.config import SimConfig
from homing.sim.main import add_sim_arguments, config_from_args
from homing.sim.timing import TimingModel
from homing.sim.worker import SimWorker

PROMPT = list(range(1000, 1016))
TOKENS = 256
SPEEDUP = 0.001
"""The clock runs 1,000x slower than the wall: the timing model would need ~30 min of wall
time for one 256-token decode (llama-3.1-8b on H100: ~7 ms a step), far past any deadline
below, so a request that completes did not wait on it."""


@pytest_asyncio.fixture
async def stub() -> AsyncIterator[tuple[SimWorker, pb_grpc.SglangSchedulerStub]]:
    async with SimWorker(SimConfig(instant=True, speedup=SPEEDUP), sidecar=False) as worker:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
            yield worker, pb_grpc.SglangSchedulerStub(channel)


def _request(rid: str, *, stream: bool, stream_interval: int = 0) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=pb.SamplingParams(
            temperature=0.0,
            max_new_tokens=TOKENS,
            ignore_eos=True,
            stream_interval=stream_interval,
        ),
        stream=stream,
    )


async def test_a_256_token_stream_is_256_one_token_chunks_then_a_complete_without_waiting_on_the_timing_model(  # noqa: E501
    stub: tuple[SimWorker, pb_grpc.SglangSchedulerStub],
) -> None:
    worker, client = stub
    modelled_s = TimingModel.from_names("llama-3.1-8b", "H100", 1).decode_step_time_s(
        1, len(PROMPT) + TOKENS
    )
    assert modelled_s * TOKENS / SPEEDUP > 600  # what the timing model would make it wait
    async with asyncio.timeout(30):
        messages = [m async for m in client.Generate(_request("s", stream=True))]
    chunks, complete = messages[:-1], messages[-1]
    assert all(m.WhichOneof("response") == "chunk" for m in chunks)
    assert [len(m.chunk.token_ids) for m in chunks] == [1] * TOKENS
    assert [m.chunk.completion_tokens for m in chunks] == list(range(1, TOKENS + 1))
    assert complete.WhichOneof("response") == "complete"
    assert complete.complete.finish_reason == "length"
    assert complete.complete.completion_tokens == TOKENS
    # SGLang 0.5.x: the final step's token travels in the last chunk and again in the complete
    assert list(complete.complete.output_ids) == list(chunks[-1].chunk.token_ids)
    assert worker.engine.stats.modeled_wall_s == 0.0


async def test_a_client_that_reads_only_after_the_engine_finished_still_gets_one_chunk_per_step(
    stub: tuple[SimWorker, pb_grpc.SglangSchedulerStub],
) -> None:
    worker, client = stub
    call = client.Generate(_request("late", stream=True))
    messages = []
    async with asyncio.timeout(30):
        messages.append(await call.read())  # the request is in the engine
        while True:  # every step has run before the rest is read
            if not worker.engine.num_streams:
                break
            await asyncio.sleep(0.01)
        while (message := await call.read()) is not grpc.aio.EOF:
            messages.append(message)
    sizes = [len(m.chunk.token_ids) for m in messages if m.WhichOneof("response") == "chunk"]
    assert sizes == [1] * TOKENS
    assert messages[-1].WhichOneof("response") == "complete"


async def test_stream_interval_and_stream_false_frame_as_sglang(
    stub: tuple[SimWorker, pb_grpc.SglangSchedulerStub],
) -> None:
    _, client = stub
    async with asyncio.timeout(30):
        streamed = [m async for m in client.Generate(_request("i", stream=True, stream_interval=4))]
        whole = [m async for m in client.Generate(_request("w", stream=False))]
    # SGLang hands tokens out when len(output) % interval == 1 (the first at once) and at finish
    sizes = [len(m.chunk.token_ids) for m in streamed[:-1]]
    assert sizes == [1] + [4] * 63 + [3]
    assert len(whole) == 1 and whole[0].WhichOneof("response") == "complete"
    assert len(whole[0].complete.output_ids) == TOKENS
    tokens = [t for m in streamed[:-1] for t in m.chunk.token_ids]
    assert tokens == list(whole[0].complete.output_ids)  # temperature 0: the same answer


def test_the_instant_flag_reaches_the_config() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    assert config_from_args(parser.parse_args(["--instant"])).instant
    assert not config_from_args(parser.parse_args([])).instant
