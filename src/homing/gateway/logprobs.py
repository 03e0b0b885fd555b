"""Log probabilities in OpenAI's response shapes, from the tokens a choice reports.

Rule of the file: pure formatting of `homing.gateway.decoding.LoggedToken`s; which tokens a
choice reports (and their text offsets) is the decoder's business. Token strings and `bytes`
are the tokenizer's (`homing.text.token_bytes`). A logprob that is not finite (-inf) is sent
as -9999.0, as OpenAI and vLLM do, since JSON has no infinity.
- chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}, ...]}, ...], "refusal": null}` on a whole answer; a streamed chunk's is
  `{"content": [...]}` with that chunk's tokens. `top_logprobs` holds the request's
  `top_logprobs` most likely tokens, in descending order ([] for 0).
- completions: `{"tokens": [str], "token_logprobs": [float | null], "top_logprobs":
  [{token: logprob} | null], "text_offset": [int]}`; each top dict holds the `logprobs` most
  likely tokens and, as OpenAI's, the sampled one too when it is not among them (so up to
  `logprobs` + 1 keys); the first prompt token (echo) has null for both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from homing.gateway.decoding import LoggedToken
from homing.text.token_bytes import TokenBytes, token_bytes
from homing.text.tokenizer import TextTokenizer

#: What a non-finite logprob is sent as.
FLOOR = -9999.0


def _value(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


class LogprobFormat:
    """OpenAI shapes of one request's reported tokens; `top`: top entries per position."""

    def __init__(self, tokenizer: TextTokenizer, top: int) -> None:
        self._bytes: TokenBytes = token_bytes(tokenizer)
        self._top = top

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = self._bytes.lookup(token_id)
        return {"token": text, "logprob": _value(logprob), "bytes": list(raw)}

    def chat_content(self, logged: Sequence[LoggedToken]) -> list[dict[str, Any]]:
        """The `content` list of chat logprobs (prompt tokens have none in chat)."""
        out: list[dict[str, Any]] = []
        for entry in logged:
            if entry.logprob is None:
                continue
            item = self._token(entry.token_id, entry.logprob)
            item["top_logprobs"] = [self._token(t, lp) for t, lp in entry.top[: self._top]]
            out.append(item)
        return out

    def chat(self, logged: Sequence[LoggedToken]) -> dict[str, Any]:
        """A whole chat answer's `logprobs`."""
        return {"content": self.chat_content(logged), "refusal": None}

    def chat_chunk(self, logged: Sequence[LoggedToken]) -> dict[str, Any] | None:
        """A streamed chat chunk's `logprobs`: None when it reports no token."""
        return {"content": self.chat_content(logged)} if logged else None

    def completion(self, logged: Sequence[LoggedToken]) -> dict[str, Any]:
        """A completions choice's (or chunk's) `logprobs`: four lists, one entry per token."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        strings = self._bytes.string_of
        for entry in logged:
            token = strings(entry.token_id)
            tokens.append(token)
            offsets.append(entry.offset)
            if entry.logprob is None:
                values.append(None)
                tops.append(None)
                continue
            value = _value(entry.logprob)
            values.append(value)
            top: dict[str, float] = {}
            for token_id, logprob in entry.top[: self._top]:
                top.setdefault(strings(token_id), _value(logprob))
            top.setdefault(token, value)  # the sampled token is always there
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def entries(
        self, logged: Sequence[LoggedToken]
    ) -> list[tuple[str, bytes, float | None, list[tuple[str, bytes, float]], int]]:
        """Each token as (token string, raw bytes, logprob or None, its top entries as
        (token string, raw bytes, logprob), text offset): the gRPC API's fields."""
        lookup = self._bytes.lookup
        out: list[tuple[str, bytes, float | None, list[tuple[str, bytes, float]], int]] = []
        for entry in logged:
            text, raw = lookup(entry.token_id)
            value = None if entry.logprob is None else _value(entry.logprob)
            top = [(*lookup(t), _value(lp)) for t, lp in entry.top[: self._top]]
            out.append((text, raw, value, top, entry.offset))
        return out

    def completion_chunk(self, logged: Sequence[LoggedToken]) -> dict[str, Any] | None:
        """A streamed completions chunk's `logprobs`: None when it reports no token."""
        return self.completion(logged) if logged else None
