"""Sans-I/O decoding of one choice: engine token messages in, text deltas and the finish
reason out.

Rule of the file: no awaits, no clocks, no queues. A `ChoiceDecoder` takes each
`TokenChunk` / `GenerateDone` of one choice's engine stream in order and returns what the
client must see: the new text (detokenized incrementally, held back while it may still be
the start of a stop string) and, when the choice ends, why ("stop", "length", "abort").
It also counts the choice's tokens by the engine's rule (`GenerateDone.new_tokens`). The
HTTP and gRPC APIs both reach it through `homing.gateway.generation.Generation`.

A request that wants more than text (log probabilities, completions `echo`) gets a
`DetailedDecoder` instead, chosen once per request: the plain decoder does no per-token work.
Its steps also carry `LoggedToken`s, aligned with the text they release, by these rules:
- a token is reported once its text has been released (a token held back by the detokenizer,
  an incomplete character, or whose text may still start a stop string, waits); a token
  whose text is empty (a skipped special token) goes with the next token that has text, or
  at the end;
- a stop string ends the choice: tokens whose text begins before the stop string (so some of
  it was sent) are reported, those after it are not; a hidden stop token id (the request's
  stop token ids) is not reported, as its text is not shown;
- `echo`: the prompt's text comes first in the first step's text, and the prompt's entries
  (when the worker sent them: `logprob_start_len` 0) first in its logprobs; offsets count
  from the start of the echoed text.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from homing.engines.client import (
    GenerateDone,
    PromptTokenLogprob,
    TokenChunk,
    TokenLogprob,
)
from homing.text.detokenizer import IncrementalDetokenizer
from homing.text.stops import StopSet
from homing.text.tokenizer import TextTokenizer


@dataclass(frozen=True)
class DecodeStep:
    """What one engine message gave: `texts` to send in order (may be empty), `finish`
    (None while the choice runs) and `new_tokens` (tokens it added, for timing)."""

    texts: tuple[str, ...]
    finish: str | None
    new_tokens: int


@dataclass(frozen=True, slots=True)
class LoggedToken:
    """One reported token: `token_id`, its `logprob` (None for the first prompt token, which
    has none), `top` ((token id, logprob) entries in descending order, possibly empty) and
    `offset`, the character offset of its text in the choice's text (echoed prompt
    included)."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]
    offset: int


@dataclass(frozen=True)
class DetailedStep(DecodeStep):
    """A `DecodeStep` of a `DetailedDecoder`: at most one text, and `logprobs`, the tokens
    that text (or this step) reports, in order."""

    logprobs: tuple[LoggedToken, ...] = ()


class ChoiceDecoder:
    """One choice's decoding state.

    `hidden_stop_ids`: token ids that end the choice without being shown or reported (the
    request's stop token ids, unless it sets ignore_eos; SGLang's and vLLM's rule).
    `silent_ids`: token ids never shown as text but otherwise ordinary tokens (counted,
    reported with their log probabilities): the model's EOS where special tokens are kept
    as text, as SGLang trims the token it stopped on. After the end:
    `received` (tokens taken from the stream), `completion_tokens` (the engine's count),
    `cached_tokens` (prompt tokens served from cache).
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        *,
        stop_set: StopSet,
        hidden_stop_ids: frozenset[int] = frozenset(),
        silent_ids: frozenset[int] = frozenset(),
        skip_special_tokens: bool = True,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        self._stops = stop_set.matcher()
        self._hidden = hidden_stop_ids
        self._silent = silent_ids
        self.received = 0
        self.completion_tokens = 0
        self.cached_tokens = 0

    def push(self, item: TokenChunk | GenerateDone) -> DecodeStep:
        """Feed the next engine message; the text to send and, at the end, the reason."""
        done = isinstance(item, GenerateDone)
        if isinstance(item, GenerateDone):
            token_ids: Sequence[int] = item.new_tokens(self.received)
            self.completion_tokens = max(self.received + len(token_ids), item.completion_tokens)
        else:
            token_ids = item.token_ids
            self.completion_tokens = self.received + len(token_ids)
        new = len(token_ids)
        self.received += new
        self.cached_tokens = item.cached_tokens
        if self._hidden:
            token_ids = _before_stop_id(token_ids, self._hidden)
        if self._silent:
            token_ids = [t for t in token_ids if t not in self._silent]
        text = self._detok.push(token_ids)
        if done:
            text += self._detok.flush()
        result = self._stops.push(text)
        texts = [result.text] if result.text else []
        if result.matched is not None:
            return DecodeStep(tuple(texts), "stop", new)
        if isinstance(item, GenerateDone):
            tail = self._stops.flush()
            if tail:
                texts.append(tail)
            return DecodeStep(tuple(texts), item.finish_reason or "stop", new)
        return DecodeStep(tuple(texts), None, new)


def _before_stop_id(token_ids: Sequence[int], stop_ids: frozenset[int]) -> Sequence[int]:
    """`token_ids` up to (not including) the first of `stop_ids`."""
    for position, token in enumerate(token_ids):
        if token in stop_ids:
            return token_ids[:position]
    return token_ids


class DetailedDecoder(ChoiceDecoder):
    """A `ChoiceDecoder` that also reports each token's log probability with the text it
    releases (`DetailedStep`), and with `echo` sends the prompt's text first (module
    docstring). `logprobs`: report log probabilities (else only `echo` is done)."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        *,
        stop_set: StopSet,
        hidden_stop_ids: frozenset[int] = frozenset(),
        silent_ids: frozenset[int] = frozenset(),
        skip_special_tokens: bool = True,
        logprobs: bool = True,
        echo: str | None = None,
    ) -> None:
        super().__init__(
            tokenizer,
            stop_set=stop_set,
            hidden_stop_ids=hidden_stop_ids,
            silent_ids=silent_ids,
            skip_special_tokens=skip_special_tokens,
        )
        self._tokenizer = tokenizer
        self._logprobs = logprobs
        self._echo = echo  # None once sent
        self._prompt_done = not (logprobs and echo is not None)
        self._base = len(echo) if echo is not None else 0  # offset of the generated text
        self._fed = 0  # characters of generated text given to the stop matcher
        self._released = 0  # of those, characters released
        self._placed: deque[tuple[int, int, TokenLogprob]] = deque()  # (start, end, entry)
        self._unplaced: list[TokenLogprob] = []  # entries whose text is not out yet

    def push(self, item: TokenChunk | GenerateDone) -> DetailedStep:
        """Feed the next engine message; its text (at most one), finish reason and the
        tokens it reports."""
        done = isinstance(item, GenerateDone)
        if isinstance(item, GenerateDone):
            token_ids: Sequence[int] = item.new_tokens(self.received)
            entries = item.new_logprobs(self.received) if self._logprobs else ()
            self.completion_tokens = max(self.received + len(token_ids), item.completion_tokens)
        else:
            token_ids = item.token_ids
            entries = item.logprobs if self._logprobs else ()
            self.completion_tokens = self.received + len(token_ids)
        new = len(token_ids)
        self.received += new
        self.cached_tokens = item.cached_tokens
        reported: list[LoggedToken] = []
        if not self._prompt_done and item.prompt_logprobs:
            self._prompt_done = True
            reported.extend(self._prompt_entries(item.prompt_logprobs))
        if self._hidden:
            token_ids = _before_stop_id(token_ids, self._hidden)
        pieces: list[str] = []
        silent = self._silent
        for position, token_id in enumerate(token_ids):
            piece = "" if token_id in silent else self._detok.push((token_id,))
            entry = entries[position] if position < len(entries) else None
            if entry is not None:
                self._unplaced.append(entry)
            if piece:
                pieces.append(piece)
                self._place(len(piece))
        if done:
            tail = self._detok.flush()
            if tail:
                pieces.append(tail)
            self._place(len(tail))  # what is left ends here, even without text
        result = self._stops.push("".join(pieces))
        self._released += len(result.text)
        text = result.text
        finish: str | None = None
        if result.matched is not None:
            finish = "stop"
            released = self._released
            for start, end, entry in self._placed:
                if start < released or end <= released:
                    reported.append(self._logged(entry, start))
            self._placed.clear()
            self._unplaced.clear()
        else:
            if done:
                tail = self._stops.flush()
                text += tail
                self._released += len(tail)
                finish = item.finish_reason or "stop"
            placed, released = self._placed, self._released
            while placed and placed[0][1] <= released:
                start, _, entry = placed.popleft()
                reported.append(self._logged(entry, start))
        if self._echo is not None:
            text = self._echo + text
            self._echo = None
        return DetailedStep((text,) if text else (), finish, new, tuple(reported))

    def _place(self, length: int) -> None:
        """The waiting entries' text is the next `length` characters of generated text."""
        start = self._fed
        self._fed += length
        if self._unplaced:
            for entry in self._unplaced:
                self._placed.append((start, self._fed, entry))
            self._unplaced.clear()

    def _logged(self, entry: TokenLogprob, start: int) -> LoggedToken:
        return LoggedToken(entry.token_id, entry.logprob, entry.top, self._base + start)

    def _prompt_entries(self, entries: Sequence[PromptTokenLogprob]) -> list[LoggedToken]:
        """The prompt's entries with their offsets in the prompt's decoded text."""
        detok = IncrementalDetokenizer(self._tokenizer)
        out: list[LoggedToken] = []
        waiting: list[PromptTokenLogprob] = []
        offset = 0
        for entry in entries:
            waiting.append(entry)
            piece = detok.push((entry.token_id,))
            if piece:
                out.extend(LoggedToken(e.token_id, e.logprob, e.top, offset) for e in waiting)
                waiting.clear()
                offset += len(piece)
        out.extend(LoggedToken(e.token_id, e.logprob, e.top, offset) for e in waiting)
        return out
