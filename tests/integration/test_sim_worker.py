"""A simulated SGLang worker over real gRPC on loopback: Generate, Abort, info, errors."""

from __future__ import annotations

import asyncio
import contextlib
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
    async def test_abort_frees_the_request_and_leaves_its_stream_open_and_silent(
        self, worker: SimWorker, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """As SGLang 0.5.23: Abort(request_id) succeeds and the request stops running at once,
        but its stream gets no complete and does not end until the client cancels the call:
        once chunks already in flight have arrived (during one other generation), nothing more
        comes during a second one. GetServerInfo counts the request as active until then."""
        call = stub.Generate(
            generate_request("long", PROMPT, stream=True, max_new_tokens=3000, ignore_eos=True)
        )
        assert (await call.read()).HasField("chunk")
        assert worker.num_running == 1
        answer = await stub.Abort(pb.AbortRequest(request_id="long", reason="test"))
        assert (answer.success, answer.message) == (True, "Request long aborted")
        assert worker.num_running == 0
        after: list[pb.GenerateResponse] = []

        async def read_all() -> None:
            while (message := await call.read()) is not grpc.aio.EOF:
                after.append(message)

        reader = asyncio.ensure_future(read_all())
        other = generate_request("other", PROMPT, stream=True, max_new_tokens=20)
        assert (await collect(stub, other))[-1].HasField("complete")
        in_flight = len(after)
        assert (await collect(stub, other))[-1].HasField("complete")
        assert len(after) == in_flight and not reader.done()
        assert all(r.HasField("chunk") for r in after)
        server = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert server.active_requests == 1
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reader
        await wait_until(lambda: worker.engine.num_silenced_streams == 0, 1.0)
        server = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert server.active_requests == 0

    async def test_abort_takes_out_every_request_whose_id_starts_with_the_given_one(
        self, worker: SimWorker, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """As SGLang's scheduler (`req.rid.startswith(recv_req.rid)`): Abort("p-1") stops
        "p-1" (its stream silenced) and "p-10" (its stream ends "abort"), not "p-2"."""
        calls = {
            rid: stub.Generate(
                generate_request(rid, PROMPT, stream=True, max_new_tokens=3000, ignore_eos=True)
            )
            for rid in ("p-1", "p-10", "p-2")
        }
        for call in calls.values():
            assert (await call.read()).HasField("chunk")
        assert worker.num_running == 3
        assert (await stub.Abort(pb.AbortRequest(request_id="p-1"))).success
        assert worker.num_running == 1
        assert sorted(worker.engine.open_request_ids()) == ["p-2"]
        rest = []
        while (message := await calls["p-10"].read()) is not grpc.aio.EOF:
            rest.append(message)
        assert rest[-1].HasField("complete") and rest[-1].complete.finish_reason == "abort"
        for call in calls.values():
            call.cancel()
        await wait_until(lambda: worker.num_running == 0, 2.0)

    async def test_abort_succeeds_for_any_id_but_a_health_check_probe(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """SGLang's servicer only forwards an abort, so an unknown (or finished) id succeeds;
        ids of its own probe requests ("HEALTH_CHECK...") are not aborted."""
        unknown = await stub.Abort(pb.AbortRequest(request_id="never-sent"))
        assert (unknown.success, unknown.message) == (True, "Request never-sent aborted")
        probe = await stub.Abort(pb.AbortRequest(request_id="HEALTH_CHECK_1"))
        assert (probe.success, probe.message) == (False, "Request HEALTH_CHECK_1 not found")

    async def test_an_id_reused_after_abort_is_a_new_request_the_old_call_cannot_abort(
        self, worker: SimWorker, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """After Abort a request id is free: a new request with it runs, and cancelling the
        silenced call of the old one leaves the new one running."""
        old = stub.Generate(
            generate_request("again", PROMPT, stream=True, max_new_tokens=3000, ignore_eos=True)
        )
        await old.read()
        assert (await stub.Abort(pb.AbortRequest(request_id="again"))).success
        new = stub.Generate(
            generate_request("again", PROMPT, stream=True, max_new_tokens=3000, ignore_eos=True)
        )
        assert (await new.read()).HasField("chunk")
        old.cancel()
        await wait_until(lambda: worker.engine.num_silenced_streams == 0, 1.0)
        assert worker.num_running == 1
        assert (await new.read()).HasField("chunk")
        new.cancel()
        await wait_until(lambda: worker.num_running == 0 and worker.engine.num_streams == 0, 1.0)

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
            (list(range(100, 4196)), 10, "exceeds the maximum allowed length (4090 tokens)"),
        ],
    )
    async def test_bad_input_is_invalid_argument(
        self,
        stub: pb_grpc.SglangSchedulerStub,
        input_ids: list[int],
        max_new_tokens: int,
        needle: str,
    ) -> None:
        """Empty prompts, out-of-vocabulary ids and prompts beyond the longest input are
        refused with INVALID_ARGUMENT and a message."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(
                stub,
                generate_request("bad", input_ids, stream=True, max_new_tokens=max_new_tokens),
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (info.value.details() or "")

    async def test_a_prompt_of_max_req_input_len_tokens_is_refused_and_one_less_is_served(
        self, stub: pb_grpc.SglangSchedulerStub
    ) -> None:
        """With a 4,096-token context, max_req_input_len is min(4095, pool - 1) - 5 = 4,090: a
        4,090-token prompt is INVALID_ARGUMENT with SGLang's message; 4,089 tokens are served,
        their completion trimmed to max_req_len - prompt - 1 = 5 tokens."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(
                stub,
                generate_request("edge", list(range(100, 4190)), stream=False, max_new_tokens=1),
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == (
            "Input length (4090 tokens) exceeds the maximum allowed length (4090 tokens). "
            "Use a shorter input or enable --allow-auto-truncate."
        )
        served = await collect(
            stub,
            generate_request(
                "below", list(range(100, 4189)), stream=False, max_new_tokens=50, ignore_eos=True
            ),
        )
        done = served[-1].complete
        assert (done.finish_reason, done.completion_tokens, len(done.output_ids)) == (
            "length",
            5,
            5,
        )

    @pytest.mark.parametrize(("max_new_tokens", "expected"), [(500, 194), (None, 194), (100, 100)])
    async def test_max_new_tokens_past_the_window_is_trimmed_silently(
        self, stub: pb_grpc.SglangSchedulerStub, max_new_tokens: int | None, expected: int
    ) -> None:
        """As SGLang's scheduler, max_new_tokens (unset: unbounded) is cut to max_req_len -
        prompt - 1 = 4095 - 3900 - 1 = 194 for a 3,900-token prompt instead of being refused;
        one that fits is kept."""
        responses = await collect(
            stub,
            generate_request(
                "trim",
                list(range(100, 4000)),
                stream=False,
                max_new_tokens=max_new_tokens,
                ignore_eos=True,
            ),
        )
        done = responses[-1].complete
        assert (done.finish_reason, done.completion_tokens) == ("length", expected)

    async def test_max_new_tokens_is_trimmed_to_what_an_empty_pool_leaves(self) -> None:
        """In a 1,024-token pool (max_req_len 1,023) a 200-token prompt may grow by at most
        pool - 208 (the prompt in whole pages) - 16 (a page) - 1 = 799 tokens."""
        config = SimConfig(speedup=200.0, kv_capacity_tokens=1024, max_context_length=4096)
        async with SimWorker(config, sidecar=False) as sim:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{sim.port}") as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                info = await stub.GetModelInfo(pb.GetModelInfoRequest())
                assert (info.max_context_length, info.max_req_input_len) == (1024, 1018)
                responses = await collect(
                    stub,
                    generate_request(
                        "pool",
                        list(range(100, 300)),
                        stream=False,
                        max_new_tokens=5000,
                        ignore_eos=True,
                    ),
                )
        done = responses[-1].complete
        assert (done.finish_reason, done.completion_tokens) == ("length", 799)

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
        """HealthCheck and grpc.health.v1 say serving; model info is what smg-grpc-servicer
        0.14.1 reports for SGLang (the KV pool as max_context_length, its own defaults for the
        token facts), server info describes the preset."""
        assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy
        health = health_pb2_grpc.HealthStub(channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        info = await stub.GetModelInfo(pb.GetModelInfoRequest())
        assert info.served_model_name == "llama-3.1-8b"
        pool = worker.limits.kv_capacity_tokens
        assert info.max_context_length == pool
        assert info.max_req_input_len == min(4096 - 1, pool - 1) - 5
        assert (info.vocab_size, info.bos_token_id, info.pad_token_id) == (128256, 1, 0)
        assert list(info.eos_token_ids) == []
        assert (info.id2label_json, info.num_labels) == ('{"0": "LABEL_0", "1": "LABEL_1"}', 2)
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
