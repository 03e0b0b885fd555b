"""What a request costs in engine messages: a non-streamed answer is one gRPC message from
the worker, a streamed one a message per chunk, and a model's `stream_interval` packs that
many tokens per chunk (the first token still alone), with the same text. Counted from the
`engine_messages` of each request's `request_done` line, over real simulated workers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers import own_app
from structlog.testing import capture_logs

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, ModelSettings, SimSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKENS = 16
LAST_DONE: list[dict[str, Any]] = []
PROMPT = [{"role": "user", "content": "Count the stars over the harbour tonight"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[App]:
    """Two models of one simulated worker each: "every-token" (`stream_interval = 1`, fixed:
    the default "auto" could coarsen under a loaded machine) and "by-four"
    (`stream_interval = 4`). The workers are instant, which also sends each step's
    tokens as a chunk of their own, as SGLang does (a timed worker joins the outputs of
    steps its reader fell behind on), so the counts are exact."""
    sim = SimSettings(workers=1, extra_args=["--instant"])
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        models=[
            ModelSettings(name="every-token", sim=sim, stream_interval=1),
            ModelSettings(name="by-four", sim=sim, stream_interval=4),
        ],
    )
    async with own_app(config) as app:
        yield app


async def _chat(app: App, model: str, *, stream: bool, **extra: Any) -> tuple[str, int, int]:
    """(text, content events, engine messages) of one chat request of TOKENS tokens; the
    request's `request_done` line is kept in `LAST_DONE`."""
    body = {
        "model": model,
        "messages": PROMPT,
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
        **extra,
    }
    url = f"http://127.0.0.1:{app.http_port}/v1/chat/completions"
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
            assert resp.status == 200, await resp.text()
            raw = (await resp.read()).decode()
    done = [e for e in logs if e["event"] == "request_done"]
    assert len(done) == 1 and done[0]["outcome"] == "ok"
    assert done[0]["completion_tokens"] == TOKENS * body.get("n", 1)
    LAST_DONE[:] = done
    messages = done[0]["engine_messages"]
    if not stream:
        return json.loads(raw)["choices"][0]["message"]["content"], 0, messages
    parts = []
    for block in raw.split("\n\n"):
        payload = block.removeprefix("data: ")
        if block and payload != "[DONE]":
            for choice in json.loads(payload)["choices"]:
                if choice["delta"].get("content"):
                    parts.append(choice["delta"]["content"])
    return "".join(parts), len(parts), messages


async def test_a_non_streamed_answer_is_one_engine_message(gateway: App) -> None:
    """Non-streamed, the worker sends the whole answer in its one `complete` message."""
    text, _, messages = await _chat(gateway, "every-token", stream=False)
    assert messages == 1
    # Its tokens' times are not known: no TTFT, no TPOT; judged on its end-to-end time.
    assert LAST_DONE[0]["ttft_ms"] is None and LAST_DONE[0]["tpot_ms"] is None
    assert LAST_DONE[0]["e2e_ms"] > 0 and LAST_DONE[0]["slo"] == "met"
    streamed, _, _ = await _chat(gateway, "every-token", stream=True)
    assert text == streamed


async def test_a_streamed_answer_is_a_message_per_token_and_the_complete(gateway: App) -> None:
    """Streamed at interval 1: one chunk per token, then the `complete`."""
    _, events, messages = await _chat(gateway, "every-token", stream=True)
    assert messages == TOKENS + 1
    assert events > 1
    assert LAST_DONE[0]["tpot_ms"] is not None


async def test_the_request_line_splits_ttft_into_its_stages(gateway: App) -> None:
    """`queue_ms` (to routing) and `routed_ttft_ms` (the lease to the first token) are parts
    of `ttft_ms` (from arrival); a non-streamed answer has a queue but no token times."""
    await _chat(gateway, "every-token", stream=True)
    line = LAST_DONE[0]
    queue, routed, ttft = line["queue_ms"], line["routed_ttft_ms"], line["ttft_ms"]
    assert queue >= 0 and routed > 0
    assert queue + routed <= ttft + 0.02  # each rounded to 0.01 ms
    await _chat(gateway, "every-token", stream=False)
    line = LAST_DONE[0]
    assert line["queue_ms"] >= 0 and line["routed_ttft_ms"] is None and line["ttft_ms"] is None


async def test_stop_strings_keep_a_non_streamed_answer_streaming_from_the_engine(
    gateway: App,
) -> None:
    """With stop strings the engine streams even for a non-streamed answer, so the gateway
    can end the choice at its stop (here one that never matches: every token arrives)."""
    text, _, messages = await _chat(gateway, "every-token", stream=False, stop=["\u2603\u2603"])
    assert messages == TOKENS + 1
    plain, _, _ = await _chat(gateway, "every-token", stream=False)
    assert text == plain


async def test_a_stream_interval_of_four_packs_four_tokens_per_chunk(gateway: App) -> None:
    """`stream_interval = 4`: the first token alone, then chunks of 4 (1 + 4 + 4 + 4 + 3
    tokens, the last chunk repeated in the complete): 6 messages, the same text."""
    text, events, messages = await _chat(gateway, "by-four", stream=True)
    assert messages == 6
    assert 2 <= events <= 5
    whole, _, _ = await _chat(gateway, "by-four", stream=False)
    assert text == whole


async def test_the_stream_interval_gauge_reports_each_models_setting(gateway: App) -> None:
    """`homing_stream_interval_tokens{model}` says what each model asks of its workers."""
    metrics = gateway.gateway_metrics
    assert metrics.value("homing_stream_interval_tokens", model="every-token") == 1
    assert metrics.value("homing_stream_interval_tokens", model="by-four") == 4


async def test_stop_strings_keep_every_token_its_own_chunk(gateway: App) -> None:
    """With stop strings a model's stream_interval is not asked for: the stop is matched
    here, and chunks would count (and charge) the tokens after it."""
    text, _, messages = await _chat(gateway, "by-four", stream=True, stop=["\u2603\u2603"])
    assert messages == TOKENS + 1
    whole, _, _ = await _chat(gateway, "by-four", stream=False)
    assert text == whole


async def test_a_non_streamed_answer_of_several_choices_has_no_tpot(gateway: App) -> None:
    """n = 4 not streamed: one message per choice, and no TPOT made up from their arrival
    times."""
    _, _, messages = await _chat(gateway, "every-token", stream=False, n=4)
    assert messages == 4
    assert LAST_DONE[0]["tpot_ms"] is None
