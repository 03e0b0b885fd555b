"""The engine client against a real simulated SGLang worker on loopback.

Claims: streamed generation yields chunks then one done (keeping the complete's tokens),
every early exit aborts the engine request, errors are classified, discovery works and the
tokenizer bundle is verified against its sha256.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import zipfile
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import pytest
import pytest_asyncio
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.engines.client import (
    EngineClient,
    EngineError,
    GenerateDone,
    GenerateParams,
    TokenChunk,
)
from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker

PROMPT = list(range(1000, 1100))


@pytest_asyncio.fixture
async def worker() -> AsyncIterator[SimWorker]:
    """One simulated worker at 10x speed on a free loopback port."""
    async with SimWorker(SimConfig(speedup=10.0)) as sim:
        yield sim


@pytest_asyncio.fixture
async def client(worker: SimWorker) -> AsyncIterator[EngineClient]:
    """An engine client connected to `worker`."""
    c = EngineClient(worker.url, worker_id="w0")
    try:
        yield c
    finally:
        await c.close()


async def wait_until_idle(worker: SimWorker, within_s: float) -> bool:
    """Poll the worker until it runs and queues nothing; False if still busy after `within_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        if worker.num_running == 0 and worker.num_waiting == 0:
            return True
        await asyncio.sleep(0.01)
    return worker.num_running == 0 and worker.num_waiting == 0


def long_params(request_id: str) -> GenerateParams:
    """A generation that runs for many seconds unless aborted."""
    return GenerateParams(
        request_id=request_id,
        input_ids=PROMPT,
        max_new_tokens=20_000,
        temperature=0.0,
        ignore_eos=True,
    )


async def test_generate_streams_chunks_then_done(client: EngineClient) -> None:
    """Chunks come first, then one done; the chunks carry completion_tokens tokens and the
    done repeats the last chunk's (so it adds none)."""
    params = GenerateParams("stream-1", PROMPT, max_new_tokens=24, temperature=0.0, ignore_eos=True)
    items = [item async for item in client.generate(params, timeout_s=30)]
    assert items and isinstance(items[-1], GenerateDone)
    assert all(isinstance(i, TokenChunk) for i in items[:-1])
    done = items[-1]
    tokens = [t for i in items[:-1] for t in i.token_ids]
    assert done.finish_reason == "length"
    assert len(tokens) == done.completion_tokens == 24
    assert done.token_ids == items[-2].token_ids and done.new_tokens(len(tokens)) == ()
    assert done.prompt_tokens == len(PROMPT)


async def test_streamed_equals_non_streamed_at_temperature_zero(client: EngineClient) -> None:
    """The non-streamed complete carries every token, equal to the streamed sequence."""
    streamed = [
        t
        async for i in client.generate(
            GenerateParams("s", PROMPT, max_new_tokens=40, temperature=0.0), timeout_s=30
        )
        if isinstance(i, TokenChunk)
        for t in i.token_ids
    ]
    whole = [
        i
        async for i in client.generate(
            GenerateParams("n", PROMPT, max_new_tokens=40, temperature=0.0, stream=False),
            timeout_s=30,
        )
    ]
    assert len(whole) == 1 and isinstance(whole[0], GenerateDone)
    assert list(whole[0].token_ids) == streamed


async def test_stop_token_id_finishes_with_matched_stop(client: EngineClient) -> None:
    """A stop token id from the greedy output ends generation with finish_reason stop."""
    first = [
        i
        async for i in client.generate(
            GenerateParams("probe", PROMPT, max_new_tokens=12, temperature=0.0, ignore_eos=True),
            timeout_s=30,
        )
    ]
    tokens = [t for i in first for t in i.token_ids]
    stop_id = tokens[5]
    cut = tokens.index(stop_id)
    items = [
        i
        async for i in client.generate(
            GenerateParams(
                "stop", PROMPT, max_new_tokens=12, temperature=0.0, stop_token_ids=(stop_id,)
            ),
            timeout_s=30,
        )
    ]
    done = items[-1]
    assert isinstance(done, GenerateDone)
    assert done.finish_reason == "stop" and done.matched_stop == stop_id
    assert done.completion_tokens == cut + 1


async def test_consumer_close_aborts_within_one_second(
    worker: SimWorker, client: EngineClient
) -> None:
    """Closing the stream after the first chunk frees the worker within 1 s."""
    stream = client.generate(long_params("close-1"), timeout_s=60)
    first = await anext(stream)
    assert isinstance(first, TokenChunk)
    assert worker.num_running == 1
    await stream.aclose()
    assert await wait_until_idle(worker, 1.0)


async def test_abort_rpc_stops_the_request_and_closing_the_silent_stream_frees_it(
    worker: SimWorker, client: EngineClient
) -> None:
    """An explicit Abort(request_id) stops the request at once; as on SGLang 0.5.23 its stream
    then gets no done and does not end (chunks in flight arrive during one other generation,
    nothing during a second), and closing the generator is what lets the worker forget it."""
    stream = client.generate(long_params("abort-1"), timeout_s=60)
    await anext(stream)
    await client.abort("abort-1", "test")
    assert await wait_until_idle(worker, 1.0)
    received: list[TokenChunk | GenerateDone] = []

    async def read() -> None:
        async for item in stream:
            received.append(item)

    reader = asyncio.ensure_future(read())
    short = GenerateParams("other", PROMPT, max_new_tokens=8, temperature=0.0, stream=False)
    assert [item async for item in client.generate(short, timeout_s=30)]
    in_flight = len(received)
    assert [item async for item in client.generate(short, timeout_s=30)]
    assert len(received) == in_flight and not reader.done()
    assert all(isinstance(item, TokenChunk) for item in received)
    assert worker.engine.num_silenced_streams == 1
    reader.cancel()  # the generator cancels its call (and sends Abort again)
    with pytest.raises(asyncio.CancelledError):
        await reader
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.0
    while loop.time() < deadline:
        if not worker.engine.num_silenced_streams:
            break
        await asyncio.sleep(0.01)
    assert worker.engine.num_silenced_streams == 0


async def test_cancellation_aborts_within_one_second(
    worker: SimWorker, client: EngineClient
) -> None:
    """Cancelling the consuming task aborts the engine request."""
    got_first = asyncio.Event()

    async def consume() -> None:
        async for _ in client.generate(long_params("cancel-1"), timeout_s=60):
            got_first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_first.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_until_idle(worker, 1.0)


async def test_deadline_is_a_transport_error_and_aborts(
    worker: SimWorker, client: EngineClient
) -> None:
    """Past its deadline the stream fails with DEADLINE_EXCEEDED and the worker is freed."""
    with pytest.raises(EngineError) as info:
        async for _ in client.generate(long_params("deadline-1"), timeout_s=0.5):
            pass
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.transport
    assert await wait_until_idle(worker, 1.0)


async def test_unreachable_worker_is_a_transport_error() -> None:
    """A worker nobody listens for fails with UNAVAILABLE, counted as transport."""
    client = EngineClient("grpc://127.0.0.1:1", worker_id="wx")
    try:
        with pytest.raises(EngineError) as info:
            async for _ in client.generate(long_params("nobody"), timeout_s=5):
                pass
        assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.transport
        assert not await client.health_check(timeout_s=0.5)
    finally:
        await client.close()


async def test_discovery_and_loads(client: EngineClient) -> None:
    """Model, server and load info come back from the worker."""
    info = await client.model_info()
    assert info.served_model_name == "llama-3.1-8b" and info.max_context_length > 0
    assert list(info.eos_token_ids) == []  # as SGLang's servicer: none reported
    server = await client.server_info()
    assert server.server_args.fields["page_size"].number_value == 16
    loads = await client.loads()
    assert loads.loads and loads.loads[0].num_running_reqs == 0
    assert await client.health_check()
    assert await client.flush_cache()


async def test_tokenizer_bundle_is_verified_zip(client: EngineClient) -> None:
    """The bundle is a zip holding tokenizer.json, and passed the sha256 check."""
    data = await client.tokenizer_bundle()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert any(n.endswith("tokenizer.json") for n in names)


class _BadDigestTokenizer(pb_grpc.SglangSchedulerServicer):
    """A servicer whose GetTokenizer lies about its digest (the sim never does)."""

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        yield common_pb2.GetTokenizerChunk(data=b"PK-part-1")
        yield common_pb2.GetTokenizerChunk(
            data=b"part-2", sha256=hashlib.sha256(b"something else").hexdigest()
        )


async def test_tokenizer_bundle_digest_mismatch_is_rejected() -> None:
    """A bundle whose bytes do not hash to the announced sha256 raises EngineError."""
    server = grpc.aio.server()
    pb_grpc.add_SglangSchedulerServicer_to_server(_BadDigestTokenizer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = EngineClient(f"grpc://127.0.0.1:{port}", worker_id="bad")
    try:
        with pytest.raises(EngineError, match="sha256") as info:
            await client.tokenizer_bundle()
        assert not info.value.transport
    finally:
        await client.close()
        await server.stop(None)
