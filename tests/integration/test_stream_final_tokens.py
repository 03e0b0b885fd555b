"""A choice's tokens are its chunks' tokens: the final step's tokens, whether a servicer
repeats them in `complete.output_ids` (SGLang 0.5.x) or sends them only there (older
servicers), reach the client exactly once, with the same text and usage."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from helpers import own_app
from openai import AsyncOpenAI

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings
from homing.engines.client import GenerateDone, GenerateParams
from homing.gateway.prepare import Intake
from homing.gateway.requests import parse_chat

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_TOKENS = 16
MESSAGES = [{"role": "user", "content": "Say hello in Chinese"}]


def _config(final_tokens: str) -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        sim=SimSettings(workers=1, speedup=10.0, extra_args=["--final-tokens", final_tokens]),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def apps() -> AsyncIterator[dict[str, App]]:
    """One gateway over a worker that repeats the final tokens, one over a worker that sends
    them only in the complete."""
    async with (
        own_app(_config("chunk_and_complete")) as new,
        own_app(_config("complete_only")) as old,
    ):
        yield {"chunk_and_complete": new, "complete_only": old}


def _client(app: App) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused", max_retries=0
    )


async def _engine_output(app: App) -> list[int]:
    """The worker's own non-streamed output ids for the request the tests send."""
    assert app.service is not None and app.pool is not None
    body = {"model": app.model.model_id, "messages": MESSAGES}
    prepared = await app.service.prepare.prepare(Intake(parse_chat(body), request_id="truth"))
    worker = app.pool.healthy_workers()[0].worker_id
    params = GenerateParams(
        request_id="truth",
        input_ids=prepared.prompt_ids,
        max_new_tokens=MAX_TOKENS,
        temperature=0.0,
        ignore_eos=True,
        stream=False,
    )
    items = [item async for item in app.pool.client(worker).generate(params)]
    assert isinstance(items[-1], GenerateDone)
    return list(items[-1].token_ids)


@pytest.mark.parametrize("style", ["chunk_and_complete", "complete_only"])
async def test_streamed_and_plain_text_hold_each_token_once(
    apps: dict[str, App], style: str
) -> None:
    """Behind either servicer, streamed and non-streamed answers are the decode of exactly
    the engine's `max_tokens` output ids, and usage counts them once."""
    app = apps[style]
    assert app.service is not None
    truth = await _engine_output(app)
    assert len(truth) == MAX_TOKENS
    expected = app.model.tokenizer.decode(truth)
    client = _client(app)
    common = {
        "model": app.model.model_id,
        "messages": MESSAGES,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "extra_body": {"ignore_eos": True},
    }
    plain = await client.chat.completions.create(**common)
    assert plain.choices[0].message.content == expected
    assert plain.usage is not None and plain.usage.completion_tokens == MAX_TOKENS
    pieces: list[str] = []
    usage = None
    stream = await client.chat.completions.create(
        **common, stream=True, stream_options={"include_usage": True}
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == expected
    assert usage is not None and usage.completion_tokens == MAX_TOKENS


async def test_both_servicers_give_the_same_text_and_usage(apps: dict[str, App]) -> None:
    """The same request behind the two servicer behaviours gets the same text and usage."""
    answers = []
    for app in apps.values():
        assert app.service is not None
        answer = await _client(app).completions.create(
            model=app.model.model_id,
            prompt="Once upon a time",
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            stream=False,
            extra_body={"ignore_eos": True},
        )
        assert answer.usage is not None
        answers.append((answer.choices[0].text, answer.usage.model_dump()))
    assert answers[0] == answers[1]
    assert answers[0][1]["completion_tokens"] == MAX_TOKENS
