"""IncrementalDetokenizer: complete characters only, and the stream equals the full decode."""

from __future__ import annotations

import pytest

from homing.text.detokenizer import IncrementalDetokenizer
from homing.text.tokenizer import TextTokenizer

REPLACEMENT = "\ufffd"
MIXED = "你好，世界！🎉👍🏽 Ünïcödé 日本語のテキスト 👨‍👩‍👧 ok 😀"


def _split_ids(tokenizer: TextTokenizer, ids: list[int]) -> list[int]:
    """Positions of ids that decode alone to a U+FFFD (part of a split character)."""
    return [i for i, token in enumerate(ids) if REPLACEMENT in tokenizer.decode([token])]


def _stream(tokenizer: TextTokenizer, ids: list[int], size: int, **kwargs: bool) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    parts = [detok.push(ids[i : i + size]) for i in range(0, len(ids), size)]
    parts.append(detok.flush())
    return parts


def test_sample_text_does_split_characters_across_tokens(served: TextTokenizer) -> None:
    """The sample really has characters cut across tokens (so the tests below mean something)."""
    assert len(_split_ids(served, served.encode(MIXED))) >= 4


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_split_characters_never_yield_replacement_char(served: TextTokenizer, size: int) -> None:
    """CJK and emoji cut across tokens never come out as U+FFFD, whatever the push size."""
    ids = served.encode(MIXED)
    parts = _stream(served, ids, size)
    assert all(REPLACEMENT not in part for part in parts)
    assert "".join(parts) == served.decode(ids) == MIXED


def test_text_comes_out_as_soon_as_a_character_completes(served: TextTokenizer) -> None:
    """A push that leaves a character incomplete returns "", the push completing it returns it."""
    ids = served.encode("ab🎉")
    first_split = _split_ids(served, ids)[0]
    detok = IncrementalDetokenizer(served)
    assert detok.push(ids[:first_split]) == "ab"
    assert detok.push([ids[first_split]]) == ""
    assert detok.has_pending
    assert detok.push(ids[first_split + 1 :]) == "🎉"
    assert not detok.has_pending
    assert detok.flush() == ""


def test_flush_emits_what_the_full_decode_gives(served: TextTokenizer) -> None:
    """Bytes that never complete a character are released at flush, as the full decode shows."""
    ids = served.encode("a 🎉")[:-1]  # drop the emoji's last piece
    detok = IncrementalDetokenizer(served)
    pushed = detok.push(ids)
    held = detok.flush()
    assert REPLACEMENT not in pushed
    assert held and pushed + held == served.decode(ids)


def test_special_tokens_are_skipped_by_default(served: TextTokenizer) -> None:
    """bos/eos vanish with skip_special_tokens=True and appear with False."""
    ids = [0, *served.encode("hi 你好"), 1]
    assert "".join(_stream(served, ids, 1)) == "hi 你好"
    kept = "".join(_stream(served, ids, 1, skip_special_tokens=False))
    assert kept == "<｜begin▁of▁sentence｜>hi 你好<｜end▁of▁sentence｜>"


def test_push_after_flush_is_refused(served: TextTokenizer) -> None:
    """The stream ends at flush; a later push raises RuntimeError."""
    detok = IncrementalDetokenizer(served)
    detok.push(served.encode("x"))
    detok.flush()
    with pytest.raises(RuntimeError):
        detok.push([1])
