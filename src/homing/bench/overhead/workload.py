"""What every request of `make bench-overhead` sends and what counts as a good answer, shared
by the client, the grpc.aio floor's child and the run; and how long anything is waited for.

Rule of this file: constants and pure functions; no I/O.
"""

from __future__ import annotations

from typing import Any

PROMPT_TEXT = "Tell me a short story about a clever fox that lives in the"
"""The user message: 16 prompt tokens with the served tokenizer's chat template."""

NON_STREAMED_TOKENS = 16
STREAMED_TOKENS = (64, 256)
RPS_CONCURRENCY = 32
READY_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 60.0


def chat_body(model: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """The OpenAI chat body every HTTP request sends."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT_TEXT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def check_usage(completion_tokens: object, expected: int) -> str | None:
    """None when `completion_tokens` (what the answer's usage says) is `expected`, else the
    error text."""
    if completion_tokens != expected:
        return f"usage says {completion_tokens!r} completion tokens, not {expected}"
    return None
