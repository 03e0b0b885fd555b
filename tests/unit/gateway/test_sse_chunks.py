"""A streamed content delta's precomputed SSE event equals the JSON of its chunk object."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from homing.gateway.http import ChunkBuilder

TEXTS = ["", "hello", ' "quoted" \\ back', "line\nbreak\ttab\x01", "你好 👋🏽", "\u2028"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_content_event_is_the_chunk_object_encoded(kind: str, include_usage: bool) -> None:
    prepared = SimpleNamespace(
        kind=kind,
        request_id="req-1",
        created=1_700_000_000,
        model=SimpleNamespace(model_id='llama "8b"'),
        include_usage=include_usage,
        system_fingerprint="fp_0123456789ab",
        logprobs=False,
    )
    chunker = ChunkBuilder(prepared)  # type: ignore[arg-type]
    for index in (0, 3, 15):
        for text in TEXTS:
            expected = json.dumps(
                chunker.chunk(index, content=text), ensure_ascii=False, separators=(",", ":")
            )
            assert chunker.content_event(index, text) == f"data: {expected}\n\n".encode()
