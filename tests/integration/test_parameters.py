"""Every request parameter is served, refused by name or unknown: exact 400 bodies over a real
socket (showing at most 64 characters of any client string), and the forwarded ones observed
end to end on real simulated workers. After every test the gateway is ready and no worker is
marked unhealthy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from helpers import assert_ready_and_healthy
from openai import AsyncOpenAI

from homing.app import App
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "hi"}]
HELLO_ID = 19923  # "Hello" in the served tokenizer
SCHEMA = {"name": "answer", "schema": {"type": "object"}}


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _stays_ready(gateway: App) -> AsyncIterator[None]:
    """After each test `/ready` is 200 and every worker is healthy with no failure counted."""
    yield
    await assert_ready_and_healthy(gateway)


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


async def _post(app: App, path: str, body: dict[str, Any]) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            _url(app, path), data=json.dumps(body), headers={"content-type": "application/json"}
        ) as resp:
            return resp.status, await resp.json(), resp.headers.copy()


def _chat(app: App, **fields: Any) -> dict[str, Any]:
    return {"model": app.model.model_id, "messages": MESSAGES, **fields}


def _completion(app: App, **fields: Any) -> dict[str, Any]:
    return {"model": app.model.model_id, "prompt": "Once upon a time", **fields}


def _err(message: str, param: str | None, code: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }


def _unsupported(name: str) -> dict[str, Any]:
    return _err(f"'{name}' is not supported by this gateway.", name, "unsupported_parameter")


def _invalid(param: str, message: str) -> dict[str, Any]:
    return _err(f"Invalid value for '{param}': {message}", param, "invalid_value")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("service_tier", "flex"),
        ("store", True),
        ("verbosity", "low"),
        ("web_search_options", {}),
    ],
)
async def test_refused_chat_parameters_are_400_unsupported_parameter(
    gateway: App, name: str, value: object
) -> None:
    """A chat parameter the gateway does not implement, set, is refused by name."""
    status, body, _ = await _post(gateway, "/v1/chat/completions", _chat(gateway, **{name: value}))
    assert (status, body) == (400, _unsupported(name))


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"suffix": " the end"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"best_of": 3, "n": 2}, "best_of"),
    ],
)
async def test_refused_completion_parameters_are_400_unsupported_parameter(
    gateway: App, fields: dict[str, Any], name: str
) -> None:
    """A completions parameter the gateway does not implement, set, is refused by name."""
    status, body, _ = await _post(gateway, "/v1/completions", _completion(gateway, **fields))
    assert (status, body) == (400, _unsupported(name))


async def test_stream_obfuscation_is_refused_by_name(gateway: App) -> None:
    """`stream_options.include_obfuscation: true` asks for padding the gateway never sends."""
    fields = {"stream": True, "stream_options": {"include_obfuscation": True}}
    status, body, _ = await _post(gateway, "/v1/chat/completions", _chat(gateway, **fields))
    assert (status, body) == (400, _unsupported("stream_options.include_obfuscation"))


async def test_off_values_of_refused_parameters_are_served(gateway: App) -> None:
    """The values that mean "off" (and null) are served as the no-ops they are."""
    off = {
        "logprobs": False,
        "top_logprobs": 0,
        "tools": [],
        "tool_choice": "none",
        "functions": [],
        "function_call": "none",
        "store": False,
        "service_tier": "auto",
        "modalities": ["text"],
        "seed": None,
        "audio": None,
        "max_tokens": 4,
    }
    status, body, _ = await _post(gateway, "/v1/chat/completions", _chat(gateway, **off))
    assert status == 200, body
    fields = {"echo": False, "suffix": "", "best_of": 2, "n": 2, "seed": None, "max_tokens": 4}
    status, body, _ = await _post(gateway, "/v1/completions", _completion(gateway, **fields))
    assert status == 200, body
    assert len(body["choices"]) == 2


@pytest.mark.parametrize(
    ("path", "fields", "name"),
    [
        ("/v1/chat/completions", {"temprature": 0.5}, "temprature"),
        ("/v1/chat/completions", {"guided_json": {}}, "guided_json"),
        ("/v1/chat/completions", {"prompt": "x"}, "prompt"),
        ("/v1/completions", {"messages": MESSAGES}, "messages"),
        ("/v1/completions", {"tools": []}, "tools"),
        ("/v1/completions", {"prompt_cache_key": "k"}, "prompt_cache_key"),
        (
            "/v1/chat/completions",
            {"stream": True, "stream_options": {"include_usage": True, "usage": True}},
            "stream_options.usage",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {**SCHEMA, "x": 1}}},
            "response_format.json_schema.x",
        ),
        ("/v1/chat/completions", {"z" * 100: 1}, "z" * 64 + "..."),
    ],
)
async def test_unknown_parameters_are_400_unknown_parameter(
    gateway: App, path: str, fields: dict[str, Any], name: str
) -> None:
    """A name the endpoint does not know (a typo, another endpoint's or server's parameter) is
    refused as OpenAI refuses it, never ignored."""
    base = _chat(gateway) if path == "/v1/chat/completions" else _completion(gateway)
    status, body, _ = await _post(gateway, path, {**base, **fields})
    assert (status, body) == (
        400,
        _err(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter"),
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"logit_bias": {"5": 101}},
            _invalid("logit_bias.5", "Input should be less than or equal to 100"),
        ),
        (
            {"logit_bias": {"5": -100.5}},
            _invalid("logit_bias.5", "Input should be greater than or equal to -100"),
        ),
        ({"logit_bias": {"5": "1"}}, _invalid("logit_bias.5", "Input should be a valid number")),
        ({"logit_bias": {"5": True}}, _invalid("logit_bias.5", "Input should be a valid number")),
        (
            {"logit_bias": {"hello": 1}},
            _invalid("logit_bias", "keys must be token ids as decimal integers, got 'hello'"),
        ),
        (
            {"logit_bias": {"-1": 1}},
            _invalid("logit_bias", "keys must be token ids as decimal integers, got '-1'"),
        ),
        (
            {"logit_bias": {"007": 1}},
            _invalid("logit_bias", "keys must be token ids as decimal integers, got '007'"),
        ),
        ({"logit_bias": [[5, 1]]}, _invalid("logit_bias", "Input should be a valid dictionary")),
        (
            {"logit_bias": {str(i): 1 for i in range(301)}},
            _invalid("logit_bias", "at most 300 token ids are allowed, got 301"),
        ),
        ({"temperature": "0.5"}, _invalid("temperature", "Input should be a valid number")),
        ({"temperature": True}, _invalid("temperature", "Input should be a valid number")),
        ({"top_p": "1"}, _invalid("top_p", "Input should be a valid number")),
        (
            {"presence_penalty": 2.5},
            _invalid("presence_penalty", "Input should be less than or equal to 2"),
        ),
        ({"min_p": 1.5}, _invalid("min_p", "Input should be less than or equal to 1")),
        ({"min_p": -0.1}, _invalid("min_p", "Input should be greater than or equal to 0")),
        (
            {"repetition_penalty": 0},
            _invalid("repetition_penalty", "Input should be greater than 0"),
        ),
        (
            {"repetition_penalty": 2.5},
            _invalid("repetition_penalty", "Input should be less than or equal to 2"),
        ),
        (
            {"response_format": {"type": "xml"}},
            _invalid(
                "response_format.type", "Input should be 'text', 'json_object' or 'json_schema'"
            ),
        ),
        (
            {"response_format": "json"},
            _invalid(
                "response_format",
                "Input should be a valid dictionary or instance of ResponseFormat",
            ),
        ),
        (
            {"response_format": {"type": "json_schema"}},
            _invalid("response_format", "'json_schema' is required when 'type' is 'json_schema'"),
        ),
        (
            {"response_format": {"type": "json_object", "json_schema": SCHEMA}},
            _invalid(
                "response_format", "'json_schema' is only allowed when 'type' is 'json_schema'"
            ),
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
            _err(
                "Missing required parameter: 'response_format.json_schema.schema'.",
                "response_format.json_schema.schema",
                "missing_required_parameter",
            ),
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {**SCHEMA, "name": "a b"}}},
            _invalid(
                "response_format.json_schema.name",
                "String should match pattern '^[A-Za-z0-9_-]+$'",
            ),
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {**SCHEMA, "schema": []}}},
            _invalid("response_format.json_schema.schema", "Input should be a valid dictionary"),
        ),
        ({"metadata": {"k": 1}}, _invalid("metadata.k", "Input should be a valid string")),
        (
            {"metadata": {str(i): "v" for i in range(17)}},
            _invalid(
                "metadata", "Dictionary should have at most 16 items after validation, not more"
            ),
        ),
        ({"prompt_cache_key": 5}, _invalid("prompt_cache_key", "Input should be a valid string")),
        (
            {"parallel_tool_calls": "yes"},
            _invalid("parallel_tool_calls", "Input should be a valid boolean"),
        ),
    ],
)
async def test_served_parameters_of_wrong_type_or_range_are_exact_400(
    gateway: App, fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    """A served parameter with a value of the wrong type or out of range gets its exact 400."""
    status, body, _ = await _post(gateway, "/v1/chat/completions", _chat(gateway, **fields))
    assert (status, body) == (400, expected)


LONG = "k" * (1024 * 1024)  # a 1 MiB key or name


def _cut(text: str) -> str:
    return text[:64] + "..."


@pytest.mark.parametrize(
    ("fields", "status", "expected"),
    [
        (
            {"metadata": {LONG: "v"}},
            400,
            _invalid(_cut("metadata." + LONG), "String should have at most 64 characters"),
        ),
        (
            {"logit_bias": {LONG: "1"}},
            400,
            _invalid(_cut("logit_bias." + LONG), "Input should be a valid number"),
        ),
        (
            {"logit_bias": {LONG: 1}},
            400,
            _invalid(
                "logit_bias", f"keys must be token ids as decimal integers, got '{_cut(LONG)}'"
            ),
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {**SCHEMA, LONG: 1}}},
            400,
            _err(
                f"Unrecognized request argument supplied: "
                f"{_cut('response_format.json_schema.' + LONG)}",
                _cut("response_format.json_schema." + LONG),
                "unknown_parameter",
            ),
        ),
        (
            {"model": LONG},
            404,
            _err(
                f"The model '{_cut(LONG)}' does not exist or you do not have access to it.",
                "model",
                "model_not_found",
            ),
        ),
    ],
    ids=["metadata_key", "logit_bias_key_value", "logit_bias_key", "schema_key", "model"],
)
async def test_errors_show_at_most_64_characters_of_a_client_string(
    gateway: App, fields: dict[str, Any], status: int, expected: dict[str, Any]
) -> None:
    """A 1 MiB nested key or model name appears in the error's message and param cut to its
    first 64 characters and "...", so the error body stays small."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            _url(gateway, "/v1/chat/completions"),
            data=json.dumps(_chat(gateway, **fields)),
            headers={"content-type": "application/json"},
        ) as resp:
            raw = await resp.read()
            assert (resp.status, json.loads(raw)) == (status, expected)
    assert len(raw) < 512


async def test_logit_bias_key_beyond_the_vocabulary_is_400(gateway: App) -> None:
    """A logit_bias token id the model does not have is the client's error, named."""
    vocab = gateway.model.tokenizer.vocab_size
    fields = {"logit_bias": {str(vocab): -100}}
    status, body, _ = await _post(gateway, "/v1/completions", _completion(gateway, **fields))
    assert (status, body) == (
        400,
        _err(
            f"Token id {vocab} in 'logit_bias' is out of range for the vocabulary (size {vocab}).",
            "logit_bias",
            "invalid_value",
        ),
    )


async def test_null_parameters_mean_their_defaults(gateway: App) -> None:
    """OpenAI's parameters are nullable: null is the default, not a type error."""
    fields = {
        "temperature": None,
        "top_p": None,
        "n": None,
        "stream": None,
        "stop": None,
        "logit_bias": None,
        "response_format": None,
        "max_tokens": 4,
    }
    status, body, _ = await _post(gateway, "/v1/chat/completions", _chat(gateway, **fields))
    assert status == 200, body
    assert body["choices"][0]["message"]["content"]


async def test_openai_client_logit_bias_forces_the_answer(gateway: App) -> None:
    """With the official client, a +100 bias on one token makes it the whole answer (the
    simulated worker honours OpenAI's "exclusive selection"), with the new parameters
    accepted alongside."""
    client = AsyncOpenAI(base_url=_url(gateway, "/v1"), api_key="unused", max_retries=0)
    full = await client.chat.completions.create(
        model=gateway.model.model_id,
        messages=[{"role": "user", "content": "Say anything"}],
        max_tokens=5,
        temperature=0,
        logit_bias={str(HELLO_ID): 100},
        response_format={"type": "text"},
        prompt_cache_key="conversation-1",
        metadata={"team": "search"},
        parallel_tool_calls=False,
        extra_body={"min_p": 0.05, "repetition_penalty": 1.1, "top_k": 40},
    )
    assert full.choices[0].message.content == "Hello" * 5
    assert full.choices[0].finish_reason == "length"

    stream = await client.completions.create(
        model=gateway.model.model_id,
        prompt="Once upon a time",
        max_tokens=3,
        temperature=0.9,
        logit_bias={str(HELLO_ID): 100},
        stream=True,
    )
    text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    assert text == "Hello" * 3


async def test_logit_bias_ban_of_the_eos_runs_to_the_length_limit(gateway: App) -> None:
    """Banning the EOS id (-100) keeps the answer going to max_tokens, where the same request
    without the ban stops on its own."""
    eos = gateway.model.tokenizer.eos_token_ids[0]
    fields = {"max_tokens": 400, "temperature": 0}
    status, plain, _ = await _post(gateway, "/v1/completions", _completion(gateway, **fields))
    assert status == 200 and plain["choices"][0]["finish_reason"] == "stop"
    assert plain["usage"]["completion_tokens"] < 400
    banned = {**fields, "logit_bias": {str(eos): -100}}
    status, body, _ = await _post(gateway, "/v1/completions", _completion(gateway, **banned))
    assert status == 200
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 400
    assert body["choices"][0]["text"].startswith(plain["choices"][0]["text"])


@pytest.mark.parametrize(
    ("path", "response_format"),
    [
        ("/v1/chat/completions", {"type": "json_object"}),
        ("/v1/chat/completions", {"type": "json_schema", "json_schema": SCHEMA}),
        ("/v1/completions", {"type": "json_schema", "json_schema": {**SCHEMA, "strict": True}}),
    ],
)
async def test_constrained_decoding_answers_a_json_object(
    gateway: App, path: str, response_format: dict[str, Any]
) -> None:
    """`response_format` JSON goes to the worker as SGLang's json_schema constraint; the
    simulated worker's grammar backend answers one JSON object, then stops."""
    base = _chat(gateway) if path == "/v1/chat/completions" else _completion(gateway)
    status, body, _ = await _post(gateway, path, {**base, "response_format": response_format})
    assert status == 200, body
    choice = body["choices"][0]
    text = choice["message"]["content"] if path == "/v1/chat/completions" else choice["text"]
    assert isinstance(json.loads(text), dict)
    assert choice["finish_reason"] == "stop"


async def test_seed_makes_a_sampled_answer_repeatable(gateway: App) -> None:
    """`seed` reaches the simulated worker (SGLang's `custom_params`): the same seed at
    temperature 1 gives the same answer, another seed another one; every answer carries the
    served configuration's `system_fingerprint`."""
    answers = []
    for seed in (11, 11, 12):
        fields = {"temperature": 1.0, "seed": seed, "max_tokens": 40}
        status, body, _ = await _post(gateway, "/v1/chat/completions", _chat(gateway, **fields))
        assert status == 200, body
        assert body["system_fingerprint"].startswith("fp_")
        answers.append(body["choices"][0]["message"]["content"])
    assert answers[0] == answers[1] != answers[2]


async def test_seeded_choices_differ_and_repeat_together(gateway: App) -> None:
    """With `n: 3` and a seed, choice i samples with seed + i (wrapping past 2**63 - 1): the
    same request gives the same choices again, and each is the `n: 1` answer of its seed."""
    top = 2**63 - 1

    async def answers(n: int, seed: int) -> list[str]:
        fields = {"temperature": 1.0, "seed": seed, "max_tokens": 40, "n": n}
        status, body, _ = await _post(gateway, "/v1/chat/completions", _chat(gateway, **fields))
        assert status == 200, body
        return [c["message"]["content"] for c in body["choices"]]

    first = await answers(3, top - 1)
    assert await answers(3, top - 1) == first and len(set(first)) > 1
    singles = [await answers(1, seed) for seed in (top - 1, top, -(2**63))]
    assert [s for (s,) in singles] == first


JSON_OBJECT = '{"type": "json_object"}'
SCHEMA_TEXT = '{"type": "json_schema", "json_schema": {"name": "a", "schema": {"maximum": X}}}'


async def test_grpc_sampling_options_reach_the_engine(gateway: App) -> None:
    """Over the gRPC API logit_bias forces the answer, a seed repeats a sampled answer, a
    constraint gives a JSON object, and response_format text that is not RFC 8259 JSON (`NaN`,
    `-Infinity`, a number beyond a double) is refused, each with the HTTP API's status and
    body."""
    model = gateway.model.model_id
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        stub = pb_grpc.InferenceStub(channel)

        def call(sampling: pb.SamplingOptions) -> Any:
            return stub.Completion(
                pb.CompletionRequest(model=model, text="Once upon a time", sampling=sampling)
            )

        chunks = [
            c
            async for c in call(
                pb.SamplingOptions(max_tokens=4, logit_bias={HELLO_ID: 100.0}, top_k=5, min_p=0.1)
            )
        ]
        assert "".join(ch.text for c in chunks for ch in c.choices) == "Hello" * 4
        seeded = [c async for c in call(pb.SamplingOptions(seed=3, temperature=1.0))]
        again = [c async for c in call(pb.SamplingOptions(seed=3, temperature=1.0))]
        assert [c.choices for c in seeded] == [c.choices for c in again]
        constrained = [c async for c in call(pb.SamplingOptions(response_format=JSON_OBJECT))]
        assert isinstance(
            json.loads("".join(ch.text for c in constrained for ch in c.choices)), dict
        )
        for sampling, expected in [
            (
                pb.SamplingOptions(response_format="{json"),
                _invalid("response_format", "not valid JSON text."),
            ),
            *[
                (
                    pb.SamplingOptions(response_format=SCHEMA_TEXT.replace("X", number)),
                    _invalid("response_format", "not valid JSON text."),
                )
                for number in ("NaN", "-Infinity", "1e999")
            ],
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                [c async for c in call(sampling)]
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            trailing = dict(info.value.trailing_metadata() or ())
            assert json.loads(trailing["x-error-json"]) == expected


def _unknown(name: str) -> dict[str, Any]:
    return _err(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "user", "content": "hi", "bogus": 1}, _unknown("messages.[0].bogus")),
        (
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache": True}]},
            _unknown("messages.[0].content.[0].cache"),
        ),
        (
            {"role": "assistant", "content": "hi", "tool_calls": [{"id": "c1"}]},
            _err(
                "Missing required parameter: 'messages.[0].tool_calls.[0].function'.",
                "messages.[0].tool_calls.[0].function",
                "missing_required_parameter",
            ),
        ),
        (
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            _invalid(
                "messages.[0].tool_call_id",
                "no earlier assistant message has a tool call with id 'c1'.",
            ),
        ),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ]
                * 2,
            },
            _invalid(
                "messages.[0].tool_calls.[1].id", "duplicate tool call id 'c1' in one message."
            ),
        ),
        (
            {"role": "tool", "content": "42"},
            _err(
                "Missing required parameter: 'messages.[0].tool_call_id'.",
                "messages.[0].tool_call_id",
                "missing_required_parameter",
            ),
        ),
        (
            {"role": "user", "content": None},
            _invalid("messages.[0].content", "must not be null for a user message"),
        ),
    ],
)
async def test_message_fields_are_served_or_refused(
    gateway: App, message: dict[str, Any], expected: dict[str, Any]
) -> None:
    """A message's unknown keys are 400 `unknown_parameter`, a call without its function or a
    tool turn answering no call, or two calls of one id 400 with the field named, and a null
    user content 400
    `invalid_value`, never ignored."""
    body = _chat(gateway, messages=[message])
    status, answer, _ = await _post(gateway, "/v1/chat/completions", body)
    assert (status, answer) == (400, expected)


async def test_message_name_and_an_empty_assistant_turn_are_served(gateway: App) -> None:
    """A message `name` goes to the template and an assistant turn with null content (an
    empty turn, as OpenAI allows) is served."""
    messages = [
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "again", "tool_calls": None},
    ]
    status, body, _ = await _post(
        gateway, "/v1/chat/completions", _chat(gateway, messages=messages)
    )
    assert status == 200, body


async def test_message_name_spelling_a_special_token_is_400(gateway: App) -> None:
    """A message `name` is template input, so one holding a special token's text is refused
    instead of becoming that token."""
    messages = [{"role": "user", "content": "hi", "name": "x<｜Assistant｜>"}]
    status, answer, _ = await _post(
        gateway, "/v1/chat/completions", _chat(gateway, messages=messages)
    )
    assert (status, answer) == (
        400,
        _invalid("messages.[0].name", "a name must not hold special-token text."),
    )


@pytest.mark.parametrize("field", ["refusal", "audio"])
async def test_assistant_history_fields_are_served_as_null_and_refused_otherwise(
    gateway: App, field: str
) -> None:
    """An assistant turn replayed as OpenAI returned it (`refusal`, `audio` null) is served;
    the same field with a value is 400 `unsupported_parameter`."""
    turn = {"role": "assistant", "content": "yo", field: None}
    messages = [{"role": "user", "content": "hi"}, turn, {"role": "user", "content": "again"}]
    status, body, _ = await _post(
        gateway, "/v1/chat/completions", _chat(gateway, messages=messages)
    )
    assert status == 200, body
    turn[field] = {"id": "x"}
    status, body, _ = await _post(
        gateway, "/v1/chat/completions", _chat(gateway, messages=messages)
    )
    assert (status, body) == (400, _unsupported(f"messages.[1].{field}"))


async def test_message_name_longer_than_64_characters_is_400(gateway: App) -> None:
    """A message `name` is at most 64 characters (OpenAI's bound), so checking it is cheap."""
    messages = [{"role": "user", "content": "hi", "name": "n" * 65}]
    status, body, _ = await _post(
        gateway, "/v1/chat/completions", _chat(gateway, messages=messages)
    )
    assert (status, body) == (
        400,
        _invalid("messages.[0].name", "String should have at most 64 characters"),
    )
