"""The simulated worker's Generate over loopback gRPC with seeds, constraints, log
probabilities and reasoning counts, in the shapes `homing.engines.client` sends and reads
(SGLang 0.5.23's)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
import pytest_asyncio
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.engines.client import (
    GenerateDone,
    GenerateParams,
    TokenChunk,
    TokenLogprob,
    build_generate_request,
    convert_response,
)
from homing.sim.config import SimConfig
from homing.sim.grammar import EBNF_UNSUPPORTED
from homing.sim.instances import instance_errors
from homing.sim.servicer import GRAMMAR_UNSUPPORTED
from homing.sim.worker import SimWorker
from homing.text.served import load_served_tokenizer

TOKENIZER = load_served_tokenizer()
THINK_END = TOKENIZER.token_to_id("</think>")
PROMPT = list(range(1000, 1064))
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
Stub = pb_grpc.SglangSchedulerStub
Start = Callable[..., Awaitable[Stub]]


@pytest_asyncio.fixture
async def start() -> AsyncIterator[Start]:
    """Starts instant workers (SimConfig overrides as keywords) and gives their stubs."""
    workers: list[SimWorker] = []
    channels: list[grpc.aio.Channel] = []

    async def launch(**overrides: Any) -> Stub:
        worker = SimWorker(SimConfig(instant=True, speedup=0.001, **overrides), sidecar=False)
        await worker.__aenter__()
        workers.append(worker)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{worker.port}")
        channels.append(channel)
        return Stub(channel)

    yield launch
    for channel in channels:
        await channel.close()
    for worker in reversed(workers):
        await worker.__aexit__(None, None, None)


@pytest_asyncio.fixture
async def stub(start: Start) -> Stub:
    return await start()


def params(rid: str, **kw: Any) -> GenerateParams:
    kw.setdefault("input_ids", PROMPT)
    kw.setdefault("max_new_tokens", 64)
    kw.setdefault("temperature", 0.0)
    return GenerateParams(request_id=rid, **kw)


async def messages(stub: Stub, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    async with asyncio.timeout(30):
        return [m async for m in stub.Generate(request)]


async def run(stub: Stub, p: GenerateParams) -> tuple[list[TokenChunk], GenerateDone]:
    """The chunks and the complete of one request, as the gateway's client reads them."""
    converted = [convert_response(m, detail=True) for m in await messages(stub, build(p))]
    *chunks, done = converted
    assert isinstance(done, GenerateDone)
    assert all(isinstance(c, TokenChunk) for c in chunks)
    return chunks, done  # type: ignore[return-value]


def build(p: GenerateParams) -> pb.GenerateRequest:
    """The wire request the gateway's client sends for `p`."""
    return build_generate_request(p)


async def refusal(stub: Stub, request: pb.GenerateRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await messages(stub, request)
    return raised.value.code(), raised.value.details() or ""


def tokens_of(chunks: list[TokenChunk], done: GenerateDone) -> list[int]:
    received = [t for c in chunks for t in c.token_ids]
    return received + list(done.new_tokens(len(received)))


def logprobs_of(chunks: list[TokenChunk], done: GenerateDone) -> list[TokenLogprob]:
    received = [e for c in chunks for e in c.logprobs]
    return received + list(done.new_logprobs(len(received)))


def chat(text: str, **variables: Any) -> list[int]:
    return TOKENIZER.encode_chat([{"role": "user", "content": text}], variables=variables)


# ---- seed


async def test_the_same_seed_gives_the_same_sampled_answer_across_request_ids(stub: Stub) -> None:
    a = tokens_of(*await run(stub, params("a", temperature=0.9, seed=7, max_new_tokens=200)))
    b = tokens_of(*await run(stub, params("b", temperature=0.9, seed=7, max_new_tokens=200)))
    assert a == b
    others = {
        tuple(tokens_of(*await run(stub, params(f"s{s}", temperature=0.9, seed=s))))
        for s in range(6)
    }
    assert len(others) > 1


async def test_without_a_seed_the_request_id_draws_the_sampled_answer(stub: Stub) -> None:
    answers = {
        tuple(tokens_of(*await run(stub, params(f"id{i}", temperature=0.9)))) for i in range(6)
    }
    assert len(answers) > 1
    again = tokens_of(*await run(stub, params("id0", temperature=0.9)))
    assert tuple(again) in answers


@pytest.mark.parametrize("seed", [1.5, "7", True, None])
async def test_a_seed_that_is_not_an_integral_number_is_invalid_argument(
    stub: Stub, seed: Any
) -> None:
    request = build(params("bad-seed", temperature=0.9))
    request.sampling_params.custom_params.update({"seed": seed})
    code, details = await refusal(stub, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "custom_params seed must be an integral number" in details


async def test_other_custom_params_are_ignored(stub: Stub) -> None:
    request = build(params("other", temperature=0.9, seed=3, stream=False))
    request.sampling_params.custom_params.update({"something": "else"})
    (with_other,) = await messages(stub, request)
    plain = tokens_of(*await run(stub, params("plain", temperature=0.9, seed=3)))
    assert list(with_other.complete.output_ids) == plain


# ---- constraints


async def test_a_json_schema_request_is_answered_with_an_instance_then_eos(stub: Stub) -> None:
    prompt = chat("Weather in Paris for 3 days, as JSON")
    chunks, done = await run(
        stub, params("j", input_ids=prompt, json_schema=json.dumps(SCHEMA), max_new_tokens=500)
    )
    tokens = tokens_of(chunks, done)
    assert done.finish_reason == "stop" and tokens[-1] == TOKENIZER.eos_token_ids[0]
    assert instance_errors(SCHEMA, json.loads(TOKENIZER.decode(tokens[:-1]))) == []


async def test_a_structural_tag_request_is_answered_with_one_structure(stub: Stub) -> None:
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<call>", "schema": SCHEMA, "end": "</call>"}],
        "triggers": ["<call>"],
    }
    chunks, done = await run(stub, params("t", structural_tag=json.dumps(tag), stream=False))
    text = TOKENIZER.decode(tokens_of(chunks, done))
    assert text.startswith("<call>") and text.endswith("</call>")
    assert instance_errors(SCHEMA, json.loads(text[len("<call>") : -len("</call>")])) == []


@pytest.mark.parametrize("stream", [True, False])
async def test_an_instance_longer_than_max_new_tokens_ends_at_length_as_its_prefix(
    stub: Stub, stream: bool
) -> None:
    """A schema whose instance is a hundred million items long: the answer is the first
    max_new_tokens tokens of one, finish "length", as a real engine cut by its limit."""
    huge = {"type": "array", "minItems": 100_000_000, "items": {"type": "integer"}}
    p = params("huge", json_schema=json.dumps(huge), max_new_tokens=40, stream=stream)
    chunks, done = await run(stub, p)
    tokens = tokens_of(chunks, done)
    assert done.finish_reason == "length" and len(tokens) == 40
    text = TOKENIZER.decode(tokens)
    assert text.startswith("[") and json.loads(text[: text.rindex(",")] + "]")
    again = await run(stub, params("plain", max_new_tokens=20))  # the worker still serves
    assert again[1].finish_reason in ("stop", "length")


async def test_a_regex_request_is_answered_with_a_full_match(stub: Stub) -> None:
    request = build(params("r", stream=False))
    request.sampling_params.regex = "(yes|no)!"
    (done,) = await messages(stub, request)
    assert TOKENIZER.decode(done.complete.output_ids) in ("yes!", "no!")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ebnf_grammar", 'root ::= "a"', f"Failed to compile ebnf grammar: {EBNF_UNSUPPORTED}"),
        ("json_schema", "{oops", "Failed to compile json grammar: "),
        ("regex", "(unclosed", "Failed to compile regex grammar: "),
    ],
)
async def test_a_constraint_the_backend_refuses_is_invalid_argument_with_sglangs_message(
    stub: Stub, field: str, value: str, message: str
) -> None:
    request = build(params("refused"))
    setattr(request.sampling_params, field, value)
    code, details = await refusal(stub, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(message)


async def test_grammar_backend_none_refuses_every_constraint(start: Start) -> None:
    stub = await start(grammar_backend="none")
    code, details = await refusal(stub, build(params("n", json_schema=json.dumps(SCHEMA))))
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, GRAMMAR_UNSUPPORTED)


async def test_grammar_backend_unconstrained_ignores_the_constraint(start: Start) -> None:
    stub = await start(grammar_backend="unconstrained")
    constrained = await run(stub, params("u1", json_schema=json.dumps(SCHEMA), max_new_tokens=300))
    plain = await run(stub, params("u2", max_new_tokens=300))
    assert tokens_of(*constrained) == tokens_of(*plain)


async def test_server_info_reports_the_grammar_backend(start: Start) -> None:
    for backend in ("simulated", "none"):
        stub = await start(grammar_backend=backend)
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert info.server_args.fields["grammar_backend"].string_value == backend


# ---- log probabilities


@pytest.mark.parametrize("stream_interval", [None, 3])
async def test_streamed_and_whole_logprobs_are_equal_and_align_with_the_tokens(
    stub: Stub, stream_interval: int | None
) -> None:
    common: dict[str, Any] = {
        "return_logprob": True,
        "top_logprobs_num": 4,
        "logprob_start_len": 10,
        "stream_interval": stream_interval,
    }
    chunks, done = await run(stub, params("ls", stream=True, **common))
    whole_chunks, whole = await run(stub, params("lw", stream=False, **common))
    assert whole_chunks == []
    streamed = logprobs_of(chunks, done)
    assert streamed == list(whole.logprobs)
    assert [e.token_id for e in streamed] == tokens_of(chunks, done)
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    # the complete repeats the last chunk's entries, as its output_ids repeat its tokens
    assert done.logprobs == chunks[-1].logprobs and done.token_ids == chunks[-1].token_ids
    for entry in streamed:
        assert entry.logprob <= 0 and len(entry.top) == 4
        assert entry.top[0] == (entry.token_id, entry.logprob)  # temperature 0: top-1
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)
    # prompt logprobs: the first chunk only when streaming; in the complete otherwise
    assert chunks[0].prompt_logprobs == whole.prompt_logprobs
    assert all(not c.prompt_logprobs for c in chunks[1:]) and not done.prompt_logprobs
    prompt = whole.prompt_logprobs
    assert [e.token_id for e in prompt] == PROMPT[10:]
    assert prompt[0].logprob is None and prompt[0].top == ()
    assert all(e.logprob is not None and len(e.top) == 4 for e in prompt[1:])


async def test_logprobs_are_deterministic_across_calls(stub: Stub) -> None:
    p = params("d", return_logprob=True, top_logprobs_num=2, temperature=0.7, seed=5)
    first, second = logprobs_of(*await run(stub, p)), logprobs_of(*await run(stub, p))
    assert first == second and first


async def test_a_one_step_stream_carries_prompt_logprobs_in_its_chunk_and_complete(
    stub: Stub,
) -> None:
    chunks, done = await run(
        stub, params("one", max_new_tokens=1, return_logprob=True, logprob_start_len=60)
    )
    assert len(chunks) == 1
    assert chunks[0].prompt_logprobs and chunks[0].prompt_logprobs == done.prompt_logprobs
    assert len(done.logprobs) == 1 and done.logprobs[0].top == ()


async def test_no_logprobs_are_sent_unless_asked(stub: Stub) -> None:
    for response in await messages(stub, build(params("plain-lp"))):
        kind = response.WhichOneof("response")
        message = getattr(response, kind)
        assert not message.HasField("output_logprobs")
        assert not message.HasField("input_logprobs")
        assert message.reasoning_tokens == 0


async def test_logprob_start_len_at_the_prompt_length_gives_no_prompt_logprobs(
    stub: Stub,
) -> None:
    p = params("end", return_logprob=True, logprob_start_len=len(PROMPT), stream=False)
    _, done = await run(stub, p)
    assert done.prompt_logprobs == () and done.logprobs


async def test_logprob_start_len_past_the_prompt_is_invalid_argument(stub: Stub) -> None:
    p = params("past", return_logprob=True, logprob_start_len=len(PROMPT) + 1)
    code, details = await refusal(stub, build(p))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "is higher than the number of input tokens" in details


async def test_prompt_logprobs_limit_the_prefix_cache_match_to_logprob_start_len(
    stub: Stub,
) -> None:
    await run(stub, params("warm", max_new_tokens=4))  # caches the prompt's pages
    _, cached = await run(stub, params("hit", max_new_tokens=4))
    assert cached.cached_tokens == 48  # all but the last token, page-aligned (16)
    _, limited = await run(
        stub, params("lim", max_new_tokens=4, return_logprob=True, logprob_start_len=20)
    )
    assert limited.cached_tokens == 16  # at most 20 tokens, page-aligned down
    _, output_only = await run(stub, params("out", max_new_tokens=4, return_logprob=True))
    assert output_only.cached_tokens == 48  # output logprobs alone do not limit it


# ---- reasoning tokens


async def test_reasoning_tokens_count_up_to_and_including_think_end(stub: Stub) -> None:
    prompt = chat("Why is the sky blue?", thinking=True)
    chunks, done = await run(
        stub, params("think", input_ids=prompt, require_reasoning=True, max_new_tokens=300)
    )
    tokens = tokens_of(chunks, done)
    end = tokens.index(THINK_END) + 1
    assert done.reasoning_tokens == end
    assert [c.reasoning_tokens for c in chunks] == [min(c.completion_tokens, end) for c in chunks]
    _, unasked = await run(stub, params("think0", input_ids=prompt, max_new_tokens=300))
    assert unasked.reasoning_tokens == 0


async def test_an_answer_that_does_not_reason_counts_no_reasoning_tokens(stub: Stub) -> None:
    _, done = await run(stub, params("nothink", input_ids=chat("Hi"), require_reasoning=True))
    assert done.reasoning_tokens == 0
