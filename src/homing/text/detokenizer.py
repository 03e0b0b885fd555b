"""Incremental detokenization: token ids in, newly complete text out.

Rule of the file: text is released only once it is complete. The `tokenizers` library's
`decoders.DecodeStream` holds a token back (its `step` returns None) while the bytes decoded
so far end in an incomplete UTF-8 sequence, so a character split across tokens (CJK, emoji,
byte-fallback pieces) never comes out as U+FFFD. The ids it holds are tracked here; at the
end `flush` gives what the full decode of the whole sequence adds to the text already
released (at that point undecodable trailing bytes do show as U+FFFD, as a full decode
shows them). The concatenation of every `push` and the `flush` equals
`tokenizer.decode(all_ids)` for the same `skip_special_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers.decoders import DecodeStream

from homing.text.tokenizer import TextTokenizer


class IncrementalDetokenizer:
    """Per-request stream decoder; one instance per generated sequence, not thread-safe."""

    def __init__(self, tokenizer: TextTokenizer, skip_special_tokens: bool = True) -> None:
        """Start an empty stream over `tokenizer`; special tokens are dropped by default."""
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._ids: list[int] = []
        self._num_pending = 0  # ids pushed since the stream last released text
        self._released: list[str] = []
        self._finished = False

    @property
    def num_tokens(self) -> int:
        """Number of token ids pushed so far."""
        return len(self._ids)

    @property
    def has_pending(self) -> bool:
        """True while some pushed ids have not yet produced text (a character is incomplete,
        or they were special tokens being skipped)."""
        return self._num_pending > 0

    def push(self, token_ids: Iterable[int]) -> str:
        """Feed the next ids; return the text they complete ("" when none is complete yet).

        Never returns a U+FFFD for a character whose bytes are split across tokens.
        Raises RuntimeError after `flush`.
        """
        if self._finished:
            raise RuntimeError("push after flush: the detokenizer's stream has ended")
        raw = self._tokenizer.tokenizer
        out: list[str] = []
        for token_id in token_ids:
            self._ids.append(token_id)
            chunk = self._stream.step(raw, token_id)
            if chunk is None:
                self._num_pending += 1
            else:
                self._num_pending = 0
                out.append(chunk)
        text = "".join(out)
        if text:
            self._released.append(text)
        return text

    def flush(self) -> str:
        """End of the sequence: return the text still held back ("" when nothing is).

        The rest is taken from the full decode of every id pushed: the part after the text
        already released (or, should the full decode not extend it, the held ids decoded on
        their own). Bytes that never completed a character come out as U+FFFD here. The
        stream is finished afterwards: a later `push` raises RuntimeError, `flush` gives "".
        """
        if self._finished:
            return ""
        self._finished = True
        if self._num_pending == 0:
            return ""
        held_ids = self._ids[len(self._ids) - self._num_pending :]
        self._num_pending = 0
        released = "".join(self._released)
        full = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special_tokens)
        if full.startswith(released):
            return full[len(released) :]
        return self._tokenizer.decode(held_ids, skip_special_tokens=self._skip_special_tokens)
