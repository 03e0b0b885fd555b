"""Generation through homing equals what the engine itself produced, on the simulator and on
real SGLang: the text is exactly the decode of the engine's greedy tokens (no token lost or
repeated, streamed or not), usage counts are the engine's, and `n`, `ignore_eos`, stop token
ids and stop strings behave the same on both engines."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from engine_fleet import Fleet
from helpers import eventually
from openai import AsyncOpenAI

from homing.app import App
from homing.engines.client import EngineClient, GenerateDone, GenerateParams
from homing.text.tokenizer import TextTokenizer

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_TOKENS = 12


def _client(app: App) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused", max_retries=0
    )


def _tokenizer(app: App) -> TextTokenizer:
    assert app.service is not None
    return app.model.tokenizer


def _prompt(app: App, tag: str) -> list[int]:
    """Prompt token ids of a sentence naming `tag` (distinct prompts keep tests apart)."""
    return _tokenizer(app).encode_plain(f"Tell me about {tag}, briefly. {uuid.uuid4().hex}")


def _model(app: App) -> str:
    assert app.pool is not None
    return app.pool.served_model_name


def _decode(app: App, ids: tuple[int, ...] | list[int]) -> str:
    return _tokenizer(app).decode(list(ids), skip_special_tokens=True)


async def _engine_greedy(fleet: Fleet, prompt: list[int], max_new: int) -> GenerateDone:
    """The engine's own greedy answer (non-streamed, EOS ignored), asked directly."""
    client = EngineClient(fleet.urls[0], worker_id="direct")
    try:
        params = GenerateParams(
            request_id=f"direct-{uuid.uuid4().hex}",
            input_ids=prompt,
            max_new_tokens=max_new,
            temperature=0.0,
            ignore_eos=True,
            stream=False,
        )
        items = [item async for item in client.generate(params)]
    finally:
        await client.close()
    done = items[-1]
    assert isinstance(done, GenerateDone)
    return done


async def test_text_and_usage_are_exactly_the_engines_tokens(gateway: App, fleet: Fleet) -> None:
    """Non-streamed and streamed, the answer is the decode of the engine's `max_tokens` greedy
    ids and usage is (prompt length, max_tokens): nothing dropped, nothing emitted twice."""
    prompt = _prompt(gateway, "caches")
    reference = await _engine_greedy(fleet, prompt, MAX_TOKENS)
    assert len(reference.token_ids) == MAX_TOKENS
    expected = _decode(gateway, reference.token_ids)
    client = _client(gateway)
    body = {"model": _model(gateway), "prompt": prompt, "max_tokens": MAX_TOKENS}
    extra = {"ignore_eos": True}

    plain = await client.completions.create(**body, temperature=0, extra_body=extra)
    assert plain.choices[0].text == expected
    assert plain.choices[0].finish_reason == "length"
    assert plain.usage is not None
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (len(prompt), MAX_TOKENS)

    stream = await client.completions.create(
        **body,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    pieces: list[str] = []
    finishes: list[str | None] = []
    usage = None
    async for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.text)
            finishes.append(choice.finish_reason)
        usage = chunk.usage or usage
    assert "".join(pieces) == expected
    assert [f for f in finishes if f] == ["length"]
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), MAX_TOKENS)


async def test_n_choices_each_carry_the_whole_greedy_answer(gateway: App, fleet: Fleet) -> None:
    """n=3 at temperature 0: three identical choices, each the engine's answer, and usage
    counts the prompt once and every choice's tokens."""
    prompt = _prompt(gateway, "batching")
    expected = _decode(gateway, (await _engine_greedy(fleet, prompt, MAX_TOKENS)).token_ids)
    answer = await _client(gateway).completions.create(
        model=_model(gateway),
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        n=3,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in answer.choices) == [0, 1, 2]
    assert [c.text for c in answer.choices] == [expected] * 3
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == 3 * MAX_TOKENS


async def test_a_stop_token_id_ends_the_answer_where_the_engine_met_it(
    gateway: App, fleet: Fleet
) -> None:
    """With `stop_token_ids` = the engine's 5th greedy token, the answer ends at its first
    occurrence, finish_reason "stop", the stop token counted but not shown; under
    `ignore_eos` the stop id is ignored as well (SGLang's finish rule), so it runs to length."""
    prompt = _prompt(gateway, "stopping")
    ids = list((await _engine_greedy(fleet, prompt, MAX_TOKENS)).token_ids)
    stop_id = ids[4]
    first = ids.index(stop_id)
    body = {"model": _model(gateway), "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    client = _client(gateway)
    answer = await client.completions.create(**body, extra_body={"stop_token_ids": [stop_id]})
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == _decode(gateway, ids[:first])
    assert answer.usage is not None
    assert answer.usage.completion_tokens == first + 1

    ignoring = await client.completions.create(
        **body, extra_body={"stop_token_ids": [stop_id], "ignore_eos": True}
    )
    assert ignoring.choices[0].finish_reason == "length"
    assert ignoring.choices[0].text == _decode(gateway, ids)


async def test_a_stop_string_cuts_the_text_before_it_streamed_and_not(
    gateway: App, fleet: Fleet
) -> None:
    """A stop string taken from the middle of the engine's answer ends the text right before
    its first occurrence, with finish_reason "stop", streamed and non-streamed alike."""
    prompt = _prompt(gateway, "strings")
    text = _decode(gateway, (await _engine_greedy(fleet, prompt, MAX_TOKENS)).token_ids)
    cut = next((i for i in range(len(text) // 3, len(text) - 2) if text[i : i + 2].strip()), None)
    assert cut is not None, f"no usable stop string in {text!r}"
    stop = text[cut : cut + 2]
    cut = text.index(stop)
    client = _client(gateway)
    body = {
        "model": _model(gateway),
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stop": [stop],
        "extra_body": {"ignore_eos": True},
    }
    plain = await client.completions.create(**body)  # type: ignore[call-overload]
    assert (plain.choices[0].text, plain.choices[0].finish_reason) == (text[:cut], "stop")
    stream = await client.completions.create(**body, stream=True)  # type: ignore[call-overload]
    pieces, finishes = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.text)
            finishes.append(choice.finish_reason)
    assert "".join(pieces) == text[:cut]
    assert [f for f in finishes if f] == ["stop"]


async def _running(fleet: Fleet, url: str) -> int:
    client = EngineClient(url, worker_id="probe")
    try:
        loads = await client.loads()
    finally:
        await client.close()
    return sum(load.num_running_reqs + load.num_waiting_reqs for load in loads.loads)


async def test_a_client_that_disconnects_frees_the_engine_within_a_second(
    gateway: App, fleet: Fleet
) -> None:
    """A stream closed by its client after the first token is aborted on the worker: the
    worker's running and waiting requests are back to 0 within 1 s (GetLoads)."""
    prompt = _prompt(gateway, "leaving")
    stream = await _client(gateway).completions.create(
        model=_model(gateway),
        prompt=prompt,
        max_tokens=2000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for _ in stream:
        break
    assert any(await asyncio.gather(*(_running(fleet, u) for u in fleet.urls)))
    await stream.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 1.0
    while loop.time() < deadline:
        if not any(await asyncio.gather(*(_running(fleet, u) for u in fleet.urls))):
            break
        await asyncio.sleep(0.05)
    assert [await _running(fleet, u) for u in fleet.urls] == [0, 0]
    assert gateway.pool is not None
    assert await eventually(lambda: all(w.in_flight == 0 for w in gateway.pool.workers()), 1.0)


async def test_a_per_request_stream_interval_packs_tokens_and_sends_the_first_alone(
    fleet: Fleet,
) -> None:
    """`SamplingParams.stream_interval` 4 (what homing sends for a model's `stream_interval`)
    on both engines: the first token comes alone, the rest in chunks of 4 (a handler that fell
    behind may join some), and the tokens are the engine's greedy answer."""
    prompt = list(range(100, 124))
    reference = await _engine_greedy(fleet, prompt, MAX_TOKENS)
    client = EngineClient(fleet.urls[0], worker_id="direct")
    try:
        params = GenerateParams(
            request_id=f"interval-{uuid.uuid4().hex}",
            input_ids=prompt,
            max_new_tokens=MAX_TOKENS,
            temperature=0.0,
            ignore_eos=True,
            stream_interval=4,
        )
        stream = client.generate(params)
        items = [item async for item in stream]
    finally:
        await client.close()
    chunks = [item.token_ids for item in items if not isinstance(item, GenerateDone)]
    sizes = [len(c) for c in chunks if c]
    assert sizes[0] == 1
    assert len(sizes) <= 1 + -(-(MAX_TOKENS - 1) // 4)  # 1 + ceil(11 / 4) = 4, not 12
    streamed = [t for c in chunks for t in c]
    assert streamed == list(reference.token_ids)
    assert stream.messages == len(items)


async def test_a_traceparent_passed_to_the_engine_changes_nothing_in_the_answer(
    gateway: App, fleet: Fleet
) -> None:
    """The engine accepts the `traceparent` metadata homing sends on Generate: the answer
    is still exactly its greedy tokens."""
    prompt = _prompt(gateway, "tracing")
    expected = _decode(gateway, (await _engine_greedy(fleet, prompt, MAX_TOKENS)).token_ids)
    answer = await _client(gateway).completions.create(
        model=_model(gateway),
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
        extra_headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    )
    assert answer.choices[0].text == expected
