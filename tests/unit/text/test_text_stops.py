"""StopSet and StopMatcher: stop strings across chunk boundaries, minimal hold-back, trimming,
and a cost linear in the stop text and in the text pushed."""

from __future__ import annotations

import itertools
import random
import tracemalloc

from homing.text.stops import NO_STOPS, StopMatcher, StopResult, StopSet


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


def _reference(stops: list[str], text: str) -> tuple[str, str | None, str]:
    """Brute force from the rule: (text emitted so far, matched stop, held text)."""
    stops = [s for s in stops if s]
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            return text[: end - len(stop)], stop, ""
    hold = max(
        (k for k in range(len(text) + 1) for s in stops if k < len(s) and s.startswith(text[-k:])),
        default=0,
    )
    return text[: len(text) - hold], None, text[len(text) - hold :]


def _random_chunks(rng: random.Random, text: str) -> list[str]:
    """`text` cut at random points (empty chunks included)."""
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 6)))
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_matcher_agrees_with_brute_force_after_every_push() -> None:
    """On random overlapping stops (1 to 8), texts and chunkings, every push agrees with the
    brute-force reference: emitted text, match and held text."""
    rng = random.Random(20240501)
    for _ in range(3000):
        alphabet = rng.choice(["ab", "abc", "a世"])
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
            for _ in range(rng.randint(1, 8))
        ]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        matcher = StopSet(stops).matcher()
        emitted, pushed, matched = "", "", None
        for chunk in _random_chunks(rng, text):
            pushed += chunk
            result = matcher.push(chunk)
            emitted += result.text
            if matched is None:
                matched = result.matched
                expected_text, expected_stop, held = _reference(stops, pushed)
                assert (emitted, matched) == (expected_text, expected_stop), (stops, pushed)
                assert matcher.held == held
            else:
                assert result == StopResult("")
        assert emitted + matcher.flush() == _reference(stops, text)[0] + _reference(stops, text)[2]


def test_matchers_sharing_a_set_agree_however_their_pushes_interleave() -> None:
    """Matchers of one set, fed the same text cut differently and interleaved (so depths are
    built by whichever gets there first), all end as the reference does."""
    rng = random.Random(99)
    for _ in range(500):
        stops = [
            "".join(rng.choice("ab世") for _ in range(rng.randint(1, 8)))
            for _ in range(rng.randint(1, 4))
        ]
        text = "".join(rng.choice("ab世") for _ in range(rng.randint(0, 40)))
        compiled = StopSet(stops)
        feeds = [(compiled.matcher(), _random_chunks(rng, text), [""]) for _ in range(3)]
        while any(chunks for _, chunks, _ in feeds):
            matcher, chunks, out = rng.choice([f for f in feeds if f[1]])
            out[0] += matcher.push(chunks.pop(0)).text
        expected_text, expected_stop, held = _reference(stops, text)
        for matcher, _, out in feeds:
            assert (out[0], matcher.matched) == (expected_text, expected_stop)
            assert matcher.flush() == held


def test_one_stop_set_serves_many_matchers_independently() -> None:
    """Matchers of one compiled set keep their own state; the set is never changed by them."""
    stops = StopSet(["<end>", "\n\n"])
    first, second = stops.matcher(), stops.matcher()
    assert first.push("a <en").text == "a "
    assert second.push("b\n").text == "b"
    assert first.push("d> c") == StopResult("", "<end>")
    assert second.push("x") == StopResult("\nx")
    assert stops.matcher().held == ""
    assert stops.stops == ("<end>", "\n\n")


def test_stop_set_drops_empty_and_duplicate_stops() -> None:
    """Empty and repeated stops are dropped; a set of none is falsy and passes text through."""
    assert StopSet(["", "x", "x", "y"]).stops == ("x", "y")
    assert not StopSet([""]) and not NO_STOPS
    assert NO_STOPS.states == 1
    assert NO_STOPS.matcher().push("text") == StopResult("text")


def test_a_stop_at_the_length_cap_is_held_whole_then_released() -> None:
    """A 1,023-character prefix of a 1,024-character stop is held, then released when it breaks."""
    stop = "ab" * 512
    matcher = StopMatcher([stop])
    assert all(matcher.push(ch).text == "" for ch in stop[:-1])
    assert matcher.held == stop[:-1]
    assert matcher.push("a").text == stop[:-1]  # only the last "a" can still begin the stop
    assert matcher.held == "a"
    assert matcher.push(stop) == StopResult("a", stop)


def _adversarial_stops(length: int) -> list[str]:
    """Four stops of `length` characters whose prefixes overlap, the worst case for suffix
    links: a run of one letter, the run with another last letter, and two periodic ones."""
    return [
        "a" * length,
        "a" * (length - 1) + "b",
        ("ab" * length)[:length],
        ("aab" * length)[:length],
    ]


def test_set_up_does_no_per_character_work() -> None:
    """Compiling 4 x 1,024 characters lays out the states and builds no depth yet."""
    stops = _adversarial_stops(1024)
    compiled = StopSet(stops)
    assert compiled.states == 1 + 1024 + 1 + 1023 + 1022  # shared prefixes are shared states
    assert (compiled.built_depth, compiled.build_steps) == (0, 0)


def test_building_every_depth_is_linear_in_the_stop_length() -> None:
    """Once texts reach every depth, link look-ups stay within 2 x the total stop length."""
    for length in (16, 256, 1024):
        for stops in (_adversarial_stops(length), [str(i) * length for i in range(4)]):
            compiled = StopSet(stops)
            for stop in stops:
                assert compiled.matcher().push(stop).matched == stop
            total = sum(map(len, stops))
            assert compiled.built_depth == length
            assert compiled.states <= total + 1
            assert compiled.build_steps <= 2 * total


def test_a_fully_built_set_at_the_caps_takes_under_a_megabyte() -> None:
    """4 x 1,024 random characters, every depth built: under 1 MB (a prefix set took 4.6 MB)."""
    rng = random.Random(7)
    stops = ["".join(rng.choice("abc世界") for _ in range(1024)) for _ in range(4)]
    tracemalloc.start()
    try:
        compiled = StopSet(stops)
        for stop in stops:
            compiled.matcher().push(stop)
        size = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert compiled.built_depth == 1024
    assert size < 1_000_000  # bytes


def test_depths_built_by_one_matcher_serve_the_others() -> None:
    """A depth is built once per set: a later matcher over the same text builds nothing."""
    stop = "x" * 100 + "!"
    compiled = StopSet([stop])
    assert compiled.matcher().push(stop[:-1]).text == ""
    assert compiled.built_depth == 100
    assert compiled.matcher().push(stop) == StopResult("", stop)
    steps = compiled.build_steps
    assert compiled.matcher().push("y" + stop) == StopResult("y", stop)
    assert (compiled.built_depth, compiled.build_steps) == (101, steps)


def test_matching_takes_at_most_two_steps_per_character() -> None:
    """However the text is cut, the automaton looks up at most 2 transitions per character."""
    stops = _adversarial_stops(1024)
    text = ("a" * 1000 + "c" + "ab" * 500 + "aab" * 300) * 4  # long near-misses, no match
    for size in (1, 7, len(text)):
        matcher = StopSet(stops).matcher()
        for at in range(0, len(text), size):
            assert matcher.push(text[at : at + size]).matched is None
        assert 0 < matcher.steps <= 2 * len(text)


def test_text_without_a_stop_start_costs_no_steps() -> None:
    """Text with no character that begins a stop passes through without automaton work."""
    matcher = StopMatcher(["<|im_end|>"])
    assert matcher.push("plain words only") == StopResult("plain words only")
    assert matcher.steps == 0
