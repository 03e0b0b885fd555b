"""Log probabilities and `echo` end to end over simulated workers, through the official
OpenAI SDK and the gRPC API: OpenAI's shapes, every token once with the text it carries,
streamed equal to whole, stop strings and tool calls, and the exact 400s of bad values."""

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp
import grpc
import pytest
from openai import AsyncOpenAI

from homing.app import App
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

ASK: list[Any] = [{"role": "user", "content": "Tell me about prefix caches, héllo wörld."}]
PROMPT = "Routing requests to replicas"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _client(app: App) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused")


async def _post(app: App, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{app.http_port}{path}", json=body) as resp:
            return resp.status, await resp.json()


def _err(message: str, param: str | None, code: str) -> dict[str, Any]:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return {"error": error}


def _joined(entries: list[Any]) -> str:
    """The text of a list of chat logprob entries: their bytes, decoded once (bytes that
    never complete a character are U+FFFD, as in the text)."""
    return b"".join(bytes(e.bytes) for e in entries).decode(errors="replace")


def _token_bytes(token: str) -> bytes:
    """A completions token string's bytes ("bytes:\\xNN..." spells bytes not UTF-8 alone)."""
    if token.startswith("bytes:"):
        return bytes.fromhex(token[len("bytes:") :].replace("\\x", ""))
    return token.encode()


def _assert_no_split_character(text: str) -> None:
    """A streamed answer's text has U+FFFD only at its end, where the length cut may fall
    inside a character: a character split across chunks is whole in one of them."""
    assert "\ufffd" not in text.rstrip("\ufffd"), text


def _check_chat_entry(entry: Any, top: int) -> None:
    """One chat entry: a finite logprob <= 0, bytes agreeing with the token, `top` top
    entries in non-increasing order, the sampled token's value where it is among them."""
    assert entry.logprob <= 0.0 and math.isfinite(entry.logprob)
    if not entry.token.startswith("bytes:"):
        assert bytes(entry.bytes) == entry.token.encode()
    values = [t.logprob for t in entry.top_logprobs]
    assert len(values) == top and values == sorted(values, reverse=True)
    for t in entry.top_logprobs:
        if t.token == entry.token:
            assert t.logprob == pytest.approx(entry.logprob)


async def test_chat_logprobs_give_every_token_of_the_answer_once(gateway: App) -> None:
    """Non-streamed chat with `top_logprobs: 3`: one entry per completion token, their bytes
    spell the answer, each with 3 top entries in descending order; `refusal` is null."""
    client = _client(gateway)
    answer = await client.chat.completions.create(
        model=gateway.model.model_id, messages=ASK, max_tokens=12, logprobs=True, top_logprobs=3
    )
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.refusal is None
    entries = choice.logprobs.content or []
    assert answer.usage is not None and len(entries) == answer.usage.completion_tokens == 12
    assert _joined(entries) == choice.message.content
    for entry in entries:
        _check_chat_entry(entry, 3)


async def test_greedy_chat_samples_the_top_token_and_streams_what_it_answers_whole(
    gateway: App,
) -> None:
    """At temperature 0 each sampled token is the top-1 entry; the streamed chunks' entries
    are the whole answer's, in order, each chunk's with the text it carries."""
    client = _client(gateway)
    fields: dict[str, Any] = {
        "model": gateway.model.model_id,
        "messages": ASK,
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    whole = await client.chat.completions.create(**fields)
    entries = whole.choices[0].logprobs.content or []  # type: ignore[union-attr]
    for entry in entries:
        assert (entry.token, entry.logprob) == (
            entry.top_logprobs[0].token,
            pytest.approx(entry.top_logprobs[0].logprob),
        )
    streamed: list[Any] = []
    text = ""
    async for chunk in await client.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            got = (choice.logprobs.content or []) if choice.logprobs else []
            assert _joined(got) == (choice.delta.content or "")
            streamed.extend(got)
            text += choice.delta.content or ""
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in entries]
    _assert_no_split_character(text)


async def test_each_of_n_choices_reports_its_own_tokens_streamed_as_whole(
    gateway: App,
) -> None:
    """`n: 3` sampled with a seed: each choice's entries spell its own answer, and the
    streamed chunks of choice i carry exactly choice i's entries of the whole answer."""
    client = _client(gateway)
    fields: dict[str, Any] = {
        "model": gateway.model.model_id,
        "messages": ASK,
        "max_tokens": 8,
        "n": 3,
        "seed": 7,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 1,
    }
    whole = await client.chat.completions.create(**fields)
    by_index: dict[int, list[Any]] = {}
    for choice in whole.choices:
        entries = choice.logprobs.content or []  # type: ignore[union-attr]
        assert _joined(entries) == choice.message.content and len(entries) == 8
        by_index[choice.index] = [e.model_dump() for e in entries]
    assert len({json.dumps(v) for v in by_index.values()}) == 3  # three different answers
    streamed: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    async for chunk in await client.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            got = (choice.logprobs.content or []) if choice.logprobs else []
            streamed[choice.index].extend(e.model_dump() for e in got)
    assert streamed == by_index


async def test_chat_without_logprobs_has_null_logprobs(gateway: App) -> None:
    """Chat that does not ask (or asks `logprobs: false`) gets `logprobs: null`."""
    for fields in ({}, {"logprobs": False}):
        status, body = await _post(
            gateway,
            "/v1/chat/completions",
            {"model": gateway.model.model_id, "messages": ASK, "max_tokens": 3, **fields},
        )
        assert status == 200 and body["choices"][0]["logprobs"] is None


async def test_stop_string_ends_the_reported_tokens_where_the_text_ends(gateway: App) -> None:
    """With a stop string met, the text ends before it and the reported tokens cover the
    text: their bytes start with it and go at most one token past it."""
    client = _client(gateway)
    model = gateway.model.model_id
    free = await client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0
    )
    tokens = free.choices[0].logprobs.tokens or []  # type: ignore[union-attr]
    stop = tokens[5].strip() or tokens[6].strip()
    stopped = await client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0, stop=[stop]
    )
    choice = stopped.choices[0]
    text = choice.text
    reported = choice.logprobs.tokens or []  # type: ignore[union-attr]
    assert choice.finish_reason == "stop" and stop not in text
    assert "".join(reported).startswith(text)
    assert len("".join(reported[:-1])) <= len(text)


async def test_completion_logprobs_hold_the_sampled_token_and_at_most_n_others(
    gateway: App,
) -> None:
    """Completions `logprobs: 2`: four lists of one entry per token; each top dict holds
    the 2 most likely tokens and the sampled one (2 or 3 keys); offsets index the text."""
    client = _client(gateway)
    answer = await client.completions.create(
        model=gateway.model.model_id, prompt=PROMPT, max_tokens=10, logprobs=2
    )
    choice = answer.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert lp.text_offset is not None and lp.text_offset[0] == 0
    for token, value, top, offset in zip(
        lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset, strict=True
    ):
        assert top[token] == pytest.approx(value) and len(top) in (2, 3)
        if not token.startswith("bytes:"):
            assert choice.text[offset:].startswith(token)


async def test_echo_puts_the_prompt_and_its_tokens_first(gateway: App) -> None:
    """`echo` with `logprobs: 1`: the text is the prompt then the answer; the prompt's tokens
    come first, the first without a value; the counts are the usage's."""
    client = _client(gateway)
    answer = await client.completions.create(
        model=gateway.model.model_id, prompt=PROMPT, max_tokens=6, logprobs=1, echo=True
    )
    choice = answer.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert answer.usage is not None
    assert len(lp.tokens) == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens[: answer.usage.prompt_tokens]) == PROMPT
    assert lp.text_offset == sorted(lp.text_offset or [])


async def test_echo_alone_and_streamed_sends_the_prompt_in_the_first_chunk(gateway: App) -> None:
    """`echo` without logprobs: the prompt leads the text and `logprobs` stays null; streamed,
    the prompt is in the first chunk."""
    client = _client(gateway)
    model = gateway.model.model_id
    whole = await client.completions.create(model=model, prompt=PROMPT, max_tokens=4, echo=True)
    assert whole.choices[0].text.startswith(PROMPT) and whole.choices[0].logprobs is None
    texts = [
        chunk.choices[0].text
        async for chunk in await client.completions.create(
            model=model, prompt=PROMPT, max_tokens=4, echo=True, stream=True
        )
        if chunk.choices
    ]
    assert texts[0].startswith(PROMPT) and len("".join(texts)) > len(PROMPT)


async def test_streamed_completion_chunks_carry_their_own_tokens(gateway: App) -> None:
    """Streamed completions with logprobs and `n: 2`: every chunk's lists have one entry per
    token of its text, each choice's tokens spell its text, offsets count from its start."""
    client = _client(gateway)
    texts: dict[int, str] = {0: "", 1: ""}
    async for chunk in await client.completions.create(
        model=gateway.model.model_id, prompt=PROMPT, max_tokens=8, logprobs=1, n=2, stream=True
    ):
        for choice in chunk.choices:
            lp = choice.logprobs
            if lp is None:
                assert choice.text == "" and choice.finish_reason is not None
                continue
            assert len(lp.tokens or []) == len(lp.token_logprobs or []) == len(lp.text_offset or [])
            assert (lp.text_offset or [None])[0] == len(texts[choice.index])
            # Bytes that never complete a character (the length cut one short) are U+FFFD
            # in the text, as a lossy decode gives them.
            spelled = b"".join(_token_bytes(t) for t in lp.tokens or [])
            assert spelled.decode(errors="replace") == choice.text
            texts[choice.index] += choice.text
    assert all(texts.values())
    for text in texts.values():
        _assert_no_split_character(text)


async def test_tool_call_answers_report_the_tokens_of_the_call(gateway: App) -> None:
    """A tool-call answer with logprobs: the entries' bytes spell the raw answer the parser
    read, so they hold the call's arguments."""
    status, body = await _post(
        gateway,
        "/v1/chat/completions",
        {
            "model": gateway.model.model_id,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "logprobs": True,
        },
    )
    assert status == 200, body
    choice = body["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    raw = b"".join(bytes(e["bytes"]) for e in choice["logprobs"]["content"]).decode(
        errors="replace"
    )
    assert json.loads(call["function"]["arguments"])["city"] in raw


async def test_streamed_tool_call_logprobs_ride_on_the_chunk_with_the_text(
    gateway: App,
) -> None:
    """Streamed with tools and logprobs: a call's first delta (its name, `arguments: ""`)
    carries no tokens, the tokens ride on the delta that carries the text they release,
    and they are the whole answer's entries in order; the role delta's content is null."""
    body = {
        "model": gateway.model.model_id,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
        "logprobs": True,
        "temperature": 0,
    }
    status, whole = await _post(gateway, "/v1/chat/completions", body)
    assert status == 200, whole
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    # every token reported, the EOS that ends the call included (not shown as text)
    assert len(whole["choices"][0]["logprobs"]["content"]) == whole["usage"]["completion_tokens"]
    chunks = []
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{gateway.http_port}/v1/chat/completions"
        async with session.post(url, json={**body, "stream": True}) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    chunks.append(json.loads(line[len(b"data: ") :]))
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["delta"] == {"role": "assistant", "content": None}
    assert _streamed_entries(choices) == whole["choices"][0]["logprobs"]["content"]


def _streamed_entries(choices: list[dict[str, Any]]) -> list[Any]:
    """The logprob entries of streamed chunks, checking that the one call header among
    them (`arguments: ""`) carries none."""
    entries, headers = [], 0
    for choice in choices:
        logged = (choice["logprobs"] or {}).get("content") or []
        calls = choice["delta"].get("tool_calls") or []
        if any(c.get("id") for c in calls):
            assert logged == [] and calls[0]["function"]["arguments"] == ""
            headers += 1
        entries.extend(logged)
    assert headers == 1
    return entries


async def test_a_call_cut_after_its_header_streams_its_tokens_on_the_finish(
    gateway: App,
) -> None:
    """Cut by `max_tokens` anywhere from its header on, a streamed call's tokens never ride
    on the header delta, and they are the whole answer's entries."""
    body = {
        "model": gateway.model.model_id,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
        "logprobs": True,
        "temperature": 0,
    }
    url = f"http://127.0.0.1:{gateway.http_port}/v1/chat/completions"
    cut_calls = 0
    for max_tokens in range(3, 9):
        status, whole = await _post(
            gateway, "/v1/chat/completions", {**body, "max_tokens": max_tokens}
        )
        assert status == 200, whole
        if not whole["choices"][0]["message"].get("tool_calls"):
            continue
        cut_calls += 1
        chunks = []
        async with aiohttp.ClientSession() as session:
            async with session.post(
                url, json={**body, "max_tokens": max_tokens, "stream": True}
            ) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        chunks.append(json.loads(line[len(b"data: ") :]))
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        assert _streamed_entries(choices) == whole["choices"][0]["logprobs"]["content"]
    assert cut_calls >= 3


async def test_grpc_answers_carry_token_logprobs(gateway: App) -> None:
    """Over gRPC: chat `logprobs` with `top_logprobs: 2` gives one `TokenLogprob` per token
    with 2 top entries, streamed and whole alike at temperature 0; a completion with `echo`
    leads with the prompt, whose first token has no `logprob`, and takes `top_logprobs` as
    over HTTP; `echo` without `logprobs` gives the text alone."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        sampling = pb.SamplingOptions(max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
        messages = [pb.ChatMessage(role="user", content=ASK[0]["content"])]
        request = pb.ChatCompletionRequest(
            model=gateway.model.model_id, messages=messages, sampling=sampling
        )
        (whole,) = [m async for m in stub.ChatCompletion(request)]
        entries = list(whole.choices[0].logprobs)
        assert len(entries) == whole.usage.completion_tokens == 6
        spelled = b"".join(e.bytes for e in entries).decode(errors="replace")
        assert spelled == whole.choices[0].text
        assert all(len(e.top) == 2 and e.HasField("logprob") for e in entries)
        request.stream = True
        streamed = [
            e async for m in stub.ChatCompletion(request) for c in m.choices for e in c.logprobs
        ]
        assert streamed == entries
        echo = pb.SamplingOptions(max_tokens=3, logprobs=True, top_logprobs=2, echo=True)
        completion = pb.CompletionRequest(model=gateway.model.model_id, text=PROMPT, sampling=echo)
        (answer,) = [m async for m in stub.Completion(completion)]
        tokens = list(answer.choices[0].logprobs)
        assert answer.choices[0].text.startswith(PROMPT)
        assert len(tokens) == answer.usage.prompt_tokens + answer.usage.completion_tokens
        assert not tokens[0].HasField("logprob") and tokens[1].HasField("logprob")
        assert all(len(t.top) == 2 for t in tokens[1:])
        # echo without logprobs: the prompt leads the text, and no token entries come.
        plain = pb.SamplingOptions(max_tokens=3, logprobs=False, echo=True)
        completion = pb.CompletionRequest(model=gateway.model.model_id, text=PROMPT, sampling=plain)
        (answer,) = [m async for m in stub.Completion(completion)]
        assert answer.choices[0].text.startswith(PROMPT) and not answer.choices[0].logprobs


async def test_grpc_parsed_stream_sends_token_logprobs_with_the_text_they_release(
    gateway: App,
) -> None:
    """Over gRPC a tool-call stream with logprobs (n 2, temperature 0) sends each token's
    entry on a message that also carries text, a call delta or the finish, never alone; the
    entries joined per choice equal the whole answer's."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        request = pb.ChatCompletionRequest(
            model=gateway.model.model_id,
            messages=[pb.ChatMessage(role="user", content="What is the weather in Paris?")],
            tools=json.dumps([WEATHER]),
            sampling=pb.SamplingOptions(n=2, temperature=0, logprobs=True, top_logprobs=1),
        )
        (whole,) = [m async for m in stub.ChatCompletion(request)]
        request.stream = True
        entries = [c async for m in stub.ChatCompletion(request) for c in m.choices]
    assert whole.choices[0].tool_calls, whole
    for choice in entries:
        if choice.logprobs:
            assert choice.text or choice.tool_calls or choice.finish_reason, choice
    for index, answer in enumerate(whole.choices):
        streamed = [e for c in entries if c.index == index for e in c.logprobs]
        assert streamed == list(answer.logprobs)


@pytest.mark.parametrize(
    ("path", "fields", "expected"),
    [
        (
            "/v1/chat/completions",
            {"top_logprobs": 2},
            _err(
                "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
                "top_logprobs",
                "invalid_value",
            ),
        ),
        (
            "/v1/chat/completions",
            {"logprobs": True, "top_logprobs": 21},
            _err(
                "Invalid value for 'top_logprobs': Input should be less than or equal to 20",
                "top_logprobs",
                "invalid_value",
            ),
        ),
        (
            "/v1/completions",
            {"logprobs": 6},
            _err(
                "Invalid value for 'logprobs': Input should be less than or equal to 5",
                "logprobs",
                "invalid_value",
            ),
        ),
        (
            "/v1/completions",
            {"logprobs": -1},
            _err(
                "Invalid value for 'logprobs': Input should be greater than or equal to 0",
                "logprobs",
                "invalid_value",
            ),
        ),
        (
            "/v1/chat/completions",
            {"logprobs": True, "top_logprobs": False},  # false is not the integer 0
            _err(
                "Invalid value for 'top_logprobs': Input should be a valid integer",
                "top_logprobs",
                "invalid_value",
            ),
        ),
        (
            "/v1/completions",
            {"logprobs": True},  # completions take a count
            _err(
                "Invalid value for 'logprobs': Input should be a valid integer",
                "logprobs",
                "invalid_value",
            ),
        ),
        (
            "/v1/chat/completions",
            {"echo": True},
            _err(
                "Unrecognized request argument supplied: echo",
                "echo",
                "unknown_parameter",
            ),
        ),
    ],
    ids=[
        "top_without_logprobs",
        "top_21",
        "completion_6",
        "completion_negative",
        "top_false",
        "completion_bool",
        "chat_echo",
    ],
)
async def test_bad_logprob_values_get_exact_400s(
    gateway: App, path: str, fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    """Each bad value gets 400 with OpenAI's wording and the parameter it names."""
    prompt = {"messages": ASK} if path.endswith("chat/completions") else {"prompt": PROMPT}
    body = {"model": gateway.model.model_id, "max_tokens": 2, **prompt, **fields}
    assert await _post(gateway, path, body) == (400, expected)
