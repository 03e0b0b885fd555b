"""StopMatcher: stop strings across chunk boundaries, minimal hold-back, trimming."""

from __future__ import annotations

import itertools

from homing.text.stops import StopMatcher, StopResult


def _run(stops: list[str], chunks: list[str]) -> tuple[str, str | None]:
    """Emitted text (pushes plus flush) and the matched stop."""
    matcher = StopMatcher(stops)
    out: list[str] = []
    matched: str | None = None
    for chunk in chunks:
        result = matcher.push(chunk)
        out.append(result.text)
        matched = matched or result.matched
    out.append(matcher.flush())
    return "".join(out), matched


def test_stop_spanning_chunks_is_matched_and_trimmed() -> None:
    """A stop cut across two pushes is found; it and the text after it are never emitted."""
    matcher = StopMatcher(["</end>"])
    assert matcher.push("Hello </e") == StopResult("Hello ")
    assert matcher.push("nd> trailing") == StopResult("", "</end>")
    assert matcher.flush() == ""


def test_text_before_a_stop_in_one_chunk_is_emitted() -> None:
    """A stop inside a chunk releases the text before it, held text included."""
    matcher = StopMatcher(["STOP"])
    assert matcher.push("ab ST").text == "ab "
    assert matcher.push("x STOP y") == StopResult("STx ", "STOP")


def test_only_a_possible_stop_prefix_is_held_back() -> None:
    """Only the longest suffix that begins a stop is held; it is released once it cannot."""
    matcher = StopMatcher(["STOP", "\n\n"])
    assert matcher.push("abc ST").text == "abc "
    assert matcher.held == "ST"
    assert matcher.push("AR").text == "STAR"
    assert matcher.held == ""
    assert matcher.push("line\n").text == "line"
    assert matcher.held == "\n"


def test_prefix_in_the_middle_of_a_chunk_is_not_held() -> None:
    """A stop prefix followed by other text in the same push is emitted at once."""
    matcher = StopMatcher(["STOP"])
    assert matcher.push("a STO b") == StopResult("a STO b")
    assert matcher.held == ""


def test_without_a_match_flush_returns_held_text() -> None:
    """With no match, flush gives back exactly the held text and nothing is lost."""
    matcher = StopMatcher(["<|im_end|>"])
    assert matcher.push("answer <|im").text == "answer "
    assert matcher.flush() == "<|im"


def test_after_a_match_later_pushes_are_empty() -> None:
    """Once a stop matched, further pushes and flush return nothing."""
    matcher = StopMatcher(["x"])
    assert matcher.push("ax") == StopResult("a", "x")
    assert matcher.push("more") == StopResult("")
    assert matcher.matched == "x"
    assert matcher.flush() == ""


def test_no_stops_pass_text_through() -> None:
    """Without stop strings (or only empty ones) every push comes back unchanged."""
    for stops in ([], [""]):
        matcher = StopMatcher(stops)
        assert matcher.push("anything") == StopResult("anything")
        assert matcher.flush() == ""


def test_first_completed_stop_wins() -> None:
    """The stop that completes first ends the text, even if a longer one started earlier."""
    assert _run(["abcd", "bc"], ["abcd"]) == ("a", "bc")
    assert _run(["bc", "abc"], ["xabc"]) == ("x", "abc")


def test_result_does_not_depend_on_chunking() -> None:
    """Every way of cutting the text into three chunks gives the same output and match."""
    stops = ["<stop>", "op!", "世界"]
    for text in ("say <sto <stop> after", "st op! x", "你好世界。", "no match <st"):
        expected = _run(stops, [text])
        assert expected == _run(stops, list(text))
        for i, j in itertools.combinations(range(len(text) + 1), 2):
            assert _run(stops, [text[:i], text[i:j], text[j:]]) == expected
