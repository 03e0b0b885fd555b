"""Bad input gets an OpenAI-shaped 4xx with the exact body, and no worker is marked for it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from homing.app import App

pytestmark = pytest.mark.asyncio(loop_scope="module")

OK_MESSAGES = [{"role": "user", "content": "hi"}]


async def _post(app: App, path: str, data: bytes | str, **headers: str) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}{path}",
            data=data,
            headers={"content-type": "application/json", **headers},
        ) as resp:
            return resp.status, await resp.json(), resp.headers.copy()


async def _post_raw(app: App, path: str, body: bytes, header: bytes) -> tuple[int, Any]:
    """POST `body` with one extra raw header line (any bytes) on a fresh connection; the
    status and the JSON body."""
    head = [
        f"POST {path} HTTP/1.1".encode(),
        b"Host: 127.0.0.1",
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(body),
        b"Connection: close",
        header,
    ]
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    try:
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    finally:
        writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def _err(message: str, param: str | None, code: str, type_: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _chat(app: App, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": app.model.model_id, "messages": OK_MESSAGES}
    body.update(fields)
    return body


async def test_body_that_is_not_json_is_400(gateway: App) -> None:
    """A body that does not parse as JSON gets 400 `invalid_json`."""
    status, body, headers = await _post(gateway, "/v1/chat/completions", "{not json")
    assert status == 400
    assert body["error"]["code"] == "invalid_json"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("The request body is not valid JSON")
    assert headers["x-request-id"]


async def test_body_that_is_not_an_object_is_400(gateway: App) -> None:
    """A JSON array as the body gets 400 `invalid_body`."""
    status, body, _ = await _post(gateway, "/v1/chat/completions", "[1, 2]")
    assert status == 400
    assert body == _err("The request body must be a JSON object.", None, "invalid_body")


@pytest.mark.parametrize(
    ("fields", "status", "expected"),
    [
        (
            {"messages": None},
            400,
            _err(
                "Invalid value for 'messages': Input should be a valid list",
                "messages",
                "invalid_value",
            ),
        ),
        (
            {"messages": []},
            400,
            _err(
                "Invalid value for 'messages': List should have at least 1 item after "
                "validation, not 0",
                "messages",
                "invalid_value",
            ),
        ),
        (
            {"messages": [{"role": "user"}]},
            400,
            _err(
                "Missing required parameter: 'messages.[0].content'.",
                "messages.[0].content",
                "missing_required_parameter",
            ),
        ),
        (
            {"messages": [{"role": "wizard", "content": "x"}]},
            400,
            _err(
                "Invalid value for 'messages.[0].role': Input should be 'system', 'user', "
                "'assistant', 'tool', 'developer' or 'function'",
                "messages.[0].role",
                "invalid_value",
            ),
        ),
        (
            {"max_tokens": 0},
            400,
            _err(
                "Invalid value for 'max_tokens': Input should be greater than or equal to 1",
                "max_tokens",
                "invalid_value",
            ),
        ),
        (
            {"max_tokens": 2.5},
            400,
            _err(
                "Invalid value for 'max_tokens': Input should be a valid integer",
                "max_tokens",
                "invalid_value",
            ),
        ),
        (
            {"max_tokens": "10"},
            400,
            _err(
                "Invalid value for 'max_tokens': Input should be a valid integer",
                "max_tokens",
                "invalid_value",
            ),
        ),
        (
            {"temperature": 2.5},
            400,
            _err(
                "Invalid value for 'temperature': Input should be less than or equal to 2",
                "temperature",
                "invalid_value",
            ),
        ),
        (
            {"temperature": -0.1},
            400,
            _err(
                "Invalid value for 'temperature': Input should be greater than or equal to 0",
                "temperature",
                "invalid_value",
            ),
        ),
        (
            {"top_p": 1.5},
            400,
            _err(
                "Invalid value for 'top_p': Input should be less than or equal to 1",
                "top_p",
                "invalid_value",
            ),
        ),
        (
            {"top_p": 0},
            400,
            _err(
                "Invalid value for 'top_p': Input should be greater than 0",
                "top_p",
                "invalid_value",
            ),
        ),
        (
            {"n": 0},
            400,
            _err(
                "Invalid value for 'n': Input should be greater than or equal to 1",
                "n",
                "invalid_value",
            ),
        ),
        (
            {"stream_options": {"include_usage": True}},
            400,
            _err(
                "The 'stream_options' parameter is only allowed when 'stream' is true.",
                "stream_options",
                "invalid_value",
            ),
        ),
    ],
)
async def test_invalid_chat_fields_get_exact_400(
    gateway: App, fields: dict[str, Any], status: int, expected: dict
) -> None:
    """Each invalid chat field gets its exact OpenAI-shaped error body."""
    got_status, body, _ = await _post(
        gateway, "/v1/chat/completions", json.dumps(_chat(gateway, **fields))
    )
    assert (got_status, body) == (status, expected)


async def test_missing_messages_is_400(gateway: App) -> None:
    """A chat body without `messages` names the missing parameter."""
    status, body, _ = await _post(
        gateway, "/v1/chat/completions", json.dumps({"model": gateway.model.model_id})
    )
    assert status == 400
    assert body == _err(
        "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
    )


async def test_unknown_model_is_404_model_not_found(gateway: App) -> None:
    """A model the gateway does not serve gets 404 `model_not_found`."""
    status, body, _ = await _post(
        gateway, "/v1/chat/completions", json.dumps(_chat(gateway, model="gpt-9"))
    )
    assert status == 404
    assert body == _err(
        "The model 'gpt-9' does not exist or you do not have access to it.",
        "model",
        "model_not_found",
    )


async def test_prompt_beyond_context_is_400_context_length_exceeded(gateway: App) -> None:
    """prompt + max_tokens beyond the model's context is 400 `context_length_exceeded`."""
    limit = gateway.model.max_context_length
    prompt = [1000] * (limit - 10)
    status, body, _ = await _post(
        gateway,
        "/v1/completions",
        json.dumps({"model": gateway.model.model_id, "prompt": prompt, "max_tokens": 100}),
    )
    assert status == 400
    assert body == _err(
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{limit + 90} tokens ({limit - 10} in the prompt, 100 for the completion). Please "
        "reduce the prompt or the completion length.",
        "prompt",
        "context_length_exceeded",
    )


async def test_token_id_outside_vocabulary_is_400(gateway: App) -> None:
    """A prompt token id beyond the vocabulary is a client error, not a worker failure."""
    vocab = gateway.model.tokenizer.vocab_size
    status, body, _ = await _post(
        gateway,
        "/v1/completions",
        json.dumps({"model": gateway.model.model_id, "prompt": [5, vocab + 3]}),
    )
    assert status == 400
    assert body == _err(
        f"Token id {vocab + 3} in 'prompt' is out of range for the vocabulary (size {vocab}).",
        "prompt",
        "invalid_value",
    )


async def test_version_header_that_is_not_utf8_is_checked_after_the_request(gateway: App) -> None:
    """An `x-homing-version` of bytes that are not UTF-8 is 400 `invalid_header_value`, but
    only once the request itself is valid: an unknown model's 404 and a prompt past the
    context window's 400 come first."""
    header = b"x-homing-version: v-\xff\xed\xa0\x80"
    unknown = json.dumps(_chat(gateway, model="gpt-9")).encode()
    status, body = await _post_raw(gateway, "/v1/chat/completions", unknown, header)
    assert status == 404
    assert body == _err(
        "The model 'gpt-9' does not exist or you do not have access to it.",
        "model",
        "model_not_found",
    )
    limit = gateway.model.max_context_length
    too_long = {"model": gateway.model.model_id, "prompt": [1000] * (limit - 10), "max_tokens": 100}
    status, body = await _post_raw(
        gateway, "/v1/completions", json.dumps(too_long).encode(), header
    )
    assert status == 400
    assert body["error"]["code"] == "context_length_exceeded"
    status, body = await _post_raw(
        gateway, "/v1/chat/completions", json.dumps(_chat(gateway)).encode(), header
    )
    assert status == 400
    assert body == _err(
        "The x-homing-version header is not valid UTF-8.",
        "x-homing-version",
        "invalid_header_value",
    )


async def test_oversize_body_is_413(gateway: App) -> None:
    """A body over the configured limit gets 413 `request_too_large`."""
    limit = gateway.config.gateway.max_body_bytes
    status, body, _ = await _post(gateway, "/v1/completions", "x" * (limit + 1))
    assert status == 413
    assert body == _err(
        f"The request body is too large (limit {limit} bytes).", None, "request_too_large"
    )


async def test_unknown_route_is_404_json(gateway: App) -> None:
    """An unknown path answers an OpenAI-shaped 404, not an HTML page."""
    status, body, _ = await _post(gateway, "/v1/nothing", "{}")
    assert status == 404
    assert body == _err("Not Found", None, "not_found")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ('{"model": "m", "max_tokens": ' + "9" * 5000 + "}", "The request body is not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "The request body is JSON nested too deeply to be read."),
        (
            '{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "The request body contains an unpaired UTF-16 surrogate escape.",
        ),
    ],
)
async def test_hostile_json_is_400_not_500(gateway: App, raw: str, message: str) -> None:
    """Huge integers, deep nesting and lone surrogates are client errors (400 invalid_json)."""
    status, body, _ = await _post(gateway, "/v1/chat/completions", raw)
    assert status == 400
    assert body["error"]["code"] == "invalid_json"
    assert body["error"]["message"].startswith(message)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 0}, "top_k"),
        ({"top_k": -7}, "top_k"),
        ({"top_k": 99_999_999_999}, "top_k"),
        ({"stop_token_ids": [99_999_999_999]}, "stop_token_ids"),
        ({"stop_token_ids": [4_000_000_000]}, "stop_token_ids"),
        ({"seed": 2**70}, "seed"),
    ],
)
async def test_out_of_range_engine_parameters_are_400(
    gateway: App, fields: dict[str, Any], param: str
) -> None:
    """Values the engine cannot take (int32/vocab ranges) are refused with the param named."""
    status, body, _ = await _post(
        gateway, "/v1/chat/completions", json.dumps(_chat(gateway, **fields))
    )
    assert status == 400
    assert body["error"]["param"] == param


async def test_rejected_request_writes_one_log_line(gateway: App) -> None:
    """A request refused before routing still gets its `request_done` line with the outcome."""
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        status, _, headers = await _post(
            gateway, "/v1/chat/completions", json.dumps(_chat(gateway, n=0))
        )
    assert status == 400
    lines = [entry for entry in logs if entry["event"] == "request_done"]
    assert len(lines) == 1
    assert lines[0]["outcome"] == "error_400"
    assert lines[0]["request_id"] == headers["x-request-id"]


async def test_client_errors_never_mark_a_worker(gateway: App) -> None:
    """After all the bad requests above, every worker is healthy with no failures counted."""
    assert all(w.healthy and w.consecutive_failures == 0 for w in gateway.pool.workers())
