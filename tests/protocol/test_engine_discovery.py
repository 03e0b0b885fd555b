"""What homing learns from each engine at discovery, on the simulator and on real SGLang: the
tokenizer it streams (GetTokenizer) is the model's, health checks answer, the model is listed
under the engine's own name, and the vocabulary comes from the tokenizer, not from
GetModelInfo (real SGLang reports the servicer's default vocab_size there)."""

from __future__ import annotations

import aiohttp
import pytest
from engine_fleet import Fleet
from helpers import assert_ready_and_healthy

from homing.app import App
from homing.engines.client import EngineClient
from homing.engines.pool import served_name
from homing.text.served import load_served_tokenizer
from homing.text.tokenizer import TextTokenizer

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = "Routing keeps the cache warm. 前缀缓存命中 🌏 <|User|> 12,345.678"


async def test_each_engine_streams_the_models_tokenizer(gateway: App, fleet: Fleet) -> None:
    """GetTokenizer's bundle from every worker loads and tokenizes exactly as the model's
    tokenizer does (ids and chat template), which is the one the gateway serves with."""
    reference = load_served_tokenizer()
    expected = reference.encode_plain(TEXT)
    messages = [{"role": "user", "content": "hi"}]
    for url in fleet.urls:
        client = EngineClient(url, worker_id="probe")
        try:
            bundle = await client.tokenizer_bundle()
        finally:
            await client.close()
        tokenizer = TextTokenizer.from_bundle(bundle)
        assert tokenizer.encode_plain(TEXT) == expected
        assert tokenizer.vocab_size == reference.vocab_size
        assert tokenizer.apply_chat_template(messages) == reference.apply_chat_template(messages)
    assert gateway.service is not None
    assert gateway.model.tokenizer.encode_plain(TEXT) == expected


async def test_workers_answer_health_checks_and_the_model_is_listed(
    gateway: App, fleet: Fleet
) -> None:
    """HealthCheck answers healthy on every worker, /ready counts them all, and /v1/models
    lists the model under the name GetModelInfo gives."""
    names = set()
    for url in fleet.urls:
        client = EngineClient(url, worker_id="probe")
        try:
            assert await client.health_check(timeout_s=30.0)
            names.add(served_name(await client.model_info()))
        finally:
            await client.close()
    assert len(names) == 1
    await assert_ready_and_healthy(gateway)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{gateway.http_port}/v1/models") as resp:
            assert resp.status == 200
            listed = [m["id"] for m in (await resp.json())["data"]]
    assert listed == list(names)


async def test_token_ids_past_the_reported_vocab_size_are_accepted(gateway: App) -> None:
    """A prompt id the tokenizer has but GetModelInfo's vocab_size (128256 on real SGLang)
    would exclude is served; one past the tokenizer's vocabulary is a 400."""
    assert gateway.service is not None and gateway.pool is not None
    vocab = gateway.model.tokenizer.vocab_size
    assert vocab > 128256
    body = {"model": gateway.pool.served_model_name, "max_tokens": 1, "temperature": 0}
    url = f"http://127.0.0.1:{gateway.http_port}/v1/completions"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={**body, "prompt": [100, 200, vocab - 1]}) as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(url, json={**body, "prompt": [100, vocab]}) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
    assert error["param"] == "prompt"
    assert f"Token id {vocab} in 'prompt' is out of range" in error["message"]


async def test_the_context_window_is_what_the_engine_serves_untrimmed(gateway: App) -> None:
    """A request filling the window exactly gets all its `max_tokens` (the engine does not
    trim it), one token more is 400 `context_length_exceeded`, and so is a prompt past the
    engine's longest input (real SGLang reports its KV pool size as max_context_length)."""
    assert gateway.service is not None and gateway.pool is not None
    model = gateway.model
    window, longest = model.max_context_length, model.max_prompt_tokens
    assert longest < window
    completion = 8
    body = {"model": model.model_id, "temperature": 0, "ignore_eos": True}
    url = f"http://127.0.0.1:{gateway.http_port}/v1/completions"
    async with aiohttp.ClientSession() as http:
        prompt = [1000 + i % 5000 for i in range(window - completion)]
        fits = {**body, "prompt": prompt, "max_tokens": completion}
        async with http.post(url, json=fits) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["usage"]["completion_tokens"] == completion
        async with http.post(url, json={**fits, "max_tokens": completion + 1}) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["code"] == "context_length_exceeded"
            assert error["message"].startswith(
                f"This model's maximum context length is {window} tokens."
            )
        too_long = {**body, "prompt": [1000] * (longest + 1), "max_tokens": 1}
        async with http.post(url, json=too_long) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
    assert error == {
        "message": f"This model's maximum prompt length is {longest} tokens. However, your "
        f"prompt has {longest + 1} tokens. Please reduce the prompt length.",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": "context_length_exceeded",
    }
