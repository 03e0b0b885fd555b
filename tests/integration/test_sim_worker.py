"""A simulated SGLang worker over real gRPC on loopback: Generate, Abort, info, errors."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker
from homing.text.served import load_served_tokenizer, served_tokenizer_zip
from homing.text.tokenizer import TextTokenizer

TOKENIZER = load_served_tokenizer()
PROMPT = TOKENIZER.encode("Say hello in Chinese, please. " * 4)


@pytest_asyncio.fixture
async def worker() -> AsyncIterator[SimWorker]:
    """One worker at 20x speed with a small context window for the limit checks."""
    async with SimWorker(SimConfig(speedup=20.0, max_context_length=4096)) as sim:
        yield sim


@pytest_asyncio.fixture
async def channel(worker: SimWorker) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}") as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.SglangSchedulerStub:
    return pb_grpc.SglangSchedulerStub(channel)


def generate_request(
    rid: str,
    input_ids: list[int],
    *,
    stream: bool,
    max_new_tokens: int | None = 200,
    ignore_eos: bool = False,
    temperature: float = 0.0,
) -> pb.GenerateRequest:
    params = pb.SamplingParams(temperature=temperature, ignore_eos=ignore_eos)
    if max_new_tokens is not None:
        params.max_new_tokens = max_new_tokens
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=input_ids),
        sampling_params=params,
        stream=stream,
    )


async def collect(stub: pb_grpc.SglangSchedulerStub, req: pb.GenerateRequest) -> list:
    return [r async for r in stub.Generate(req)]


async def wait_until(predicate, timeout_s: float = 2.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


class TestGenerate:
    async def test_streamed_and_unstreamed_outputs_are_identical_at_temperature_0(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """Streamed chunks joined equal the non-streamed complete's output_ids, and the text is
        readable."""
        streamed = await collect(stub, generate_request("s", PROMPT, stream=True))
        plain = await collect(stub, generate_request("p", PROMPT, stream=False))
        chunk_ids = [t for r in streamed if r.HasField("chunk") for t in r.chunk.token_ids]
        assert len(plain) == 1 and plain[0].HasField("complete")
        assert list(plain[0].complete.output_ids) == chunk_ids
        chunks = [r for r in streamed if r.HasField("chunk")]
        # As SGLang 0.5.x's servicer: the complete repeats the last chunk's tokens.
        assert list(streamed[-1].complete.output_ids) == list(chunks[-1].chunk.token_ids)
        text = TOKENIZER.decode(chunk_ids)
        assert text.strip() and "\ufffd" not in text

    async def test_complete_is_last_with_counts_and_finish_reason(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """Chunks carry cumulative counts; exactly one complete comes last, with the EOS
        matched."""
        responses = await collect(stub, generate_request("c", PROMPT, stream=True))
        kinds = [r.WhichOneof("response") for r in responses]
        assert kinds[-1] == "complete" and kinds.count("complete") == 1
        chunks = [r.chunk for r in responses[:-1]]
        assert [c.completion_tokens for c in chunks] == list(
            itertools.accumulate(len(c.token_ids) for c in chunks)
        )
        assert all(c.prompt_tokens == len(PROMPT) for c in chunks)
        done = responses[-1].complete
        assert done.finish_reason == "stop"
        assert done.WhichOneof("matched_stop") == "matched_token_id"
        assert done.matched_token_id in TOKENIZER.eos_token_ids
        assert (done.prompt_tokens, done.completion_tokens) == (
            len(PROMPT),
            chunks[-1].completion_tokens,
        )
        assert all(r.request_id == "c" for r in responses)

    async def test_max_new_tokens_and_stop_token_ids_are_honoured(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """max_new_tokens gives "length"; a stop token id gives "stop" with that id matched."""
        short = await collect(stub, generate_request("l", PROMPT, stream=False, max_new_tokens=5))
        assert short[-1].complete.finish_reason == "length"
        assert len(short[-1].complete.output_ids) == 5
        full = await collect(stub, generate_request("f", PROMPT, stream=False))
        stop_at = full[-1].complete.output_ids[3]
        req = generate_request("t", PROMPT, stream=False)
        req.sampling_params.stop_token_ids.append(stop_at)
        stopped = (await collect(stub, req))[-1].complete
        assert stopped.finish_reason == "stop"
        assert stopped.matched_token_id == stop_at
        assert list(stopped.output_ids) == list(full[-1].complete.output_ids[:4])

    async def test_a_repeated_prompt_reports_cached_tokens(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """The second identical prompt is served from the prefix cache (full pages)."""
        prompt = list(range(2000, 2100))
        first = (await collect(stub, generate_request("a", prompt, stream=False)))[-1]
        second = (await collect(stub, generate_request("b", prompt, stream=False)))[-1]
        assert first.complete.cached_tokens == 0
        assert second.complete.cached_tokens == 96


class TestAbort:
    async def test_abort_ends_the_stream_and_the_running_count_returns_to_zero(
        self, worker: SimWorker, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """Abort(request_id) ends that stream with finish_reason "abort" and frees the
        request at once."""
        call = stub.Generate(
            generate_request("long", PROMPT, stream=True, max_new_tokens=3000, ignore_eos=True)
        )
        first = await call.read()
        assert first.HasField("chunk")
        assert worker.num_running == 1
        answer = await stub.Abort(pb.AbortRequest(request_id="long", reason="test"))
        assert answer.success
        assert worker.num_running == 0
        rest = []
        while (message := await call.read()) is not grpc.aio.EOF:
            rest.append(message)
        assert rest[-1].complete.finish_reason == "abort"
        assert [r.WhichOneof("response") for r in rest].count("complete") == 1
        assert not (await stub.Abort(pb.AbortRequest(request_id="long"))).success

    async def test_a_client_that_goes_away_aborts_its_request(
        self, worker: SimWorker, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """Cancelling the call removes the request from the scheduler within a second."""
        call = stub.Generate(
            generate_request("gone", PROMPT, stream=True, max_new_tokens=3000, ignore_eos=True)
        )
        await call.read()
        call.cancel()
        await wait_until(lambda: worker.num_running == 0 and worker.engine.num_streams == 0, 1.0)


class TestValidation:
    @pytest.mark.parametrize(
        ("input_ids", "max_new_tokens", "needle"),
        [
            ([], 10, "empty"),
            ([1, 200_000], 10, "vocab_size"),
            (list(range(100, 4196)), 10, "context length"),
            (list(range(100, 4000)), 500, "maximum context length"),
        ],
    )
    async def test_bad_input_is_invalid_argument(
        self,
        stub: pb_grpc.SglangSchedulerStub,
        input_ids: list[int],
        max_new_tokens: int,
        needle: str,
    ) -> None:
        """Empty prompts, out-of-vocabulary ids and prompts beyond the context window are
        refused with INVALID_ARGUMENT and a message."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(
                stub,
                generate_request("bad", input_ids, stream=True, max_new_tokens=max_new_tokens),
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (info.value.details() or "")

    async def test_another_engines_service_is_unimplemented(
        self, channel: grpc.aio.Channel
    ) -> None:
        """The vLLM engine service is not served here."""
        vllm = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await vllm.HealthCheck(vllm_engine_pb2.HealthCheckRequest())
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


class TestInfo:
    async def test_health_model_and_server_info(
        self, worker: SimWorker, channel: grpc.aio.Channel, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """HealthCheck and grpc.health.v1 say serving; model/server info describe the preset
        and the served tokenizer."""
        assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy
        health = health_pb2_grpc.HealthStub(channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        info = await stub.GetModelInfo(pb.GetModelInfoRequest())
        assert info.served_model_name == "llama-3.1-8b"
        assert info.max_context_length == 4096
        assert info.vocab_size == TOKENIZER.vocab_size
        assert list(info.eos_token_ids) == list(TOKENIZER.eos_token_ids)
        assert info.is_generation
        server = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert server.sglang_version == "homing-sim" and server.server_type == "grpc"
        assert server.max_total_num_tokens == worker.limits.kv_capacity_tokens
        assert server.server_args["page_size"] == 16
        assert server.server_args["max_running_requests"] == worker.limits.max_running_requests

    async def test_get_loads_reports_the_scheduler(self, stub: pb_grpc.SglangSchedulerStub) -> None:
        """GetLoads gives one rank with the pool size and the admission window; unknown
        sections are INVALID_ARGUMENT."""
        loads = await stub.GetLoads(pb.GetLoadsRequest())
        assert loads.dp_rank_count == 1 and len(loads.loads) == 1
        load = loads.loads[0]
        assert load.max_total_num_tokens > 0 and load.max_running_requests > 0
        assert load.memory.token_capacity == load.max_total_num_tokens
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GetLoads(pb.GetLoadsRequest(include=["bogus"]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    async def test_get_tokenizer_streams_the_zip_with_its_sha256_on_the_last_chunk(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """The chunks join to the served zip; only the last carries its sha256; it loads."""
        chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
        assert len(chunks) > 1
        data = b"".join(c.data for c in chunks)
        assert data == served_tokenizer_zip()
        assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
        assert all(c.sha256 == "" for c in chunks[:-1])
        bundle = TextTokenizer.from_bundle(data)
        assert bundle.encode("你好") == TOKENIZER.encode("你好")
