"""MistralParser: `[TOOL_CALLS] [{...}, ...]` (tokenizer v3) and `[TOOL_CALLS]NAME[ARGS]{...}`
(v11+)."""

from __future__ import annotations

import json
from functools import partial

from homing.text.output import CallStart, merge
from homing.text.tools.mistral import ARGS, CALL_ID, TOOL_CALLS, MistralParser, structural_tag
from tests.unit.text.tools.cases import TIME_ARGS, TRICKY_ARGS, calls, fuzz
from tests.unit.text.tools.invariance import TOOLS, WEATHER, assert_invariant

factory = partial(MistralParser, TOOLS)


def obj(name: str, args: str, call_id: str | None = None) -> str:
    """One v3 call object (Mistral-Nemo adds an `"id"` after the arguments)."""
    tail = f', "id": "{call_id}"' if call_id else ""
    return f'{{"name": {json.dumps(name)}, "arguments": {args}{tail}}}'


def v3(*objects: str) -> str:
    """A v3 call array."""
    return TOOL_CALLS + " [" + ", ".join(objects) + "]"


def v11(name: str, args: str) -> str:
    """One v11+ call."""
    return f"{TOOL_CALLS}{name}{ARGS}{args}"


def test_plain_answer_is_content() -> None:
    text = "Lists like [1, 2] and [TOOL] tags are text."
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_text_before_a_call_stays_content() -> None:
    parsed = assert_invariant(factory, "Checking. " + v3(obj("get_weather", TRICKY_ARGS)))
    assert parsed.content == "Checking. "
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_v3_parallel_calls_with_ids_are_parsed_in_order() -> None:
    text = v3(obj("get_weather", TRICKY_ARGS, "a1b2c3d4e"), obj("get_time", TIME_ARGS, "f5g6h7i8j"))
    parsed = assert_invariant(factory, text)
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS))


def test_v11_parallel_calls_are_parsed_in_order() -> None:
    text = v11("get_weather", TRICKY_ARGS) + v11("get_time", TIME_ARGS) + v11("web.search-v2", "{}")
    parsed = assert_invariant(factory, text)
    assert parsed.content == ""
    assert parsed.calls == calls(
        ("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS), ("web.search-v2", "{}")
    )


def test_v11_call_id_is_dropped() -> None:
    parsed = assert_invariant(factory, f"{TOOL_CALLS}get_time{CALL_ID}abc123XYZ{ARGS}{TIME_ARGS}")
    assert parsed.calls == calls(("get_time", TIME_ARGS))


def test_two_calls_in_one_chunk_both_parsed() -> None:
    for text in (
        v3(obj("get_weather", TRICKY_ARGS), obj("get_time", TIME_ARGS)),
        v11("get_weather", TRICKY_ARGS) + v11("get_time", TIME_ARGS),
    ):
        events = MistralParser(TOOLS).feed(text)
        assert [e for e in events if isinstance(e, CallStart)] == [
            CallStart(0, "get_weather"),
            CallStart(1, "get_time"),
        ]
        assert merge(events).calls == calls(("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS))


def test_text_after_a_v11_call_is_content_verbatim() -> None:
    for tail in (" Done.", ", then more.", "} stray", "\n\nok"):
        parsed = assert_invariant(factory, v11("get_time", TIME_ARGS) + tail)
        assert parsed.calls == calls(("get_time", TIME_ARGS))
        assert parsed.content == tail


def test_text_after_a_v3_array_is_content() -> None:
    parsed = assert_invariant(factory, v3(obj("get_time", TIME_ARGS)) + " Done.")
    assert parsed.calls == calls(("get_time", TIME_ARGS))
    assert parsed.content == " Done."


def test_arguments_cut_mid_escape_and_mid_unicode_are_invariant() -> None:
    for args in ('{"q": "a\\"b"}', '{"q": "\\u00e9\\ud83d\\ude00"}', '{"q": "é😀\\\\"}'):
        for text in (v3(obj("get_weather", args)), v11("get_weather", args)):
            parsed = assert_invariant(factory, text)
            assert parsed.calls == calls(("get_weather", args))


def test_call_cut_at_length_leaves_partial_arguments() -> None:
    partial_args = TRICKY_ARGS[: TRICKY_ARGS.index("😀") + 1]
    for text in (v3(obj("get_weather", TRICKY_ARGS)), v11("get_weather", TRICKY_ARGS)):
        parsed = assert_invariant(factory, text[: text.index("😀") + 1])
        assert parsed.content == ""
        assert parsed.calls == calls(("get_weather", partial_args))


def test_cut_inside_the_header_gives_the_text_back() -> None:
    for text in (TOOL_CALLS + ' [{"name": "get_ti', TOOL_CALLS + "get_time[AR"):
        parsed = assert_invariant(factory, text)
        assert parsed.content == text
        assert parsed.calls == []


def test_undeclared_function_is_content_verbatim() -> None:
    for text in (v3(obj("delete_all", "{}")), v11("delete_all", "{}")):
        parsed = assert_invariant(factory, text)
        assert parsed.content == text
        assert parsed.calls == []


def test_a_failed_v3_element_keeps_the_calls_before_it() -> None:
    text = v3(obj("get_time", TIME_ARGS), obj("delete_all", "{}"))
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", TIME_ARGS))
    assert parsed.content == text[text.index('{"name": "delete_all"') - 2 :]


def test_garbage_after_the_marker_is_content() -> None:
    for text in (TOOL_CALLS + " [oops]", TOOL_CALLS + "get_time" + ARGS + "oops"):
        parsed = assert_invariant(factory, text)
        assert parsed.content == text
        assert parsed.calls == []


def test_the_marker_ends_broken_arguments() -> None:
    text = v11("get_time", '{"tz": "UT') + v11("get_weather", '{"city": "Oslo"}')
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", '{"tz": "UT'), ("get_weather", '{"city": "Oslo"}'))


def test_fuzzed_texts_never_raise_and_stay_invariant() -> None:
    markers = (
        TOOL_CALLS,
        ARGS,
        CALL_ID,
        "[TOOL",
        "get_time",
        " [",
        obj("get_time", TIME_ARGS),
        v11("get_time", TIME_ARGS),
        v3(obj("get_weather", TRICKY_ARGS)),
    )
    assert fuzz(factory, markers, seed=4) > 0


def test_structural_tag_v11_has_sglang_shape() -> None:
    tag = structural_tag(TOOLS)
    assert tag is not None
    assert tag["type"] == "structural_tag"
    assert tag["triggers"] == [TOOL_CALLS]
    assert tag["structures"][0] == {
        "begin": TOOL_CALLS + "get_weather" + ARGS,
        "schema": WEATHER.parameters,
        "end": "",
    }
    assert tag["structures"][2]["schema"] == {"type": "object"}
    assert structural_tag(()) is None


def test_structural_tag_v3_has_sglang_shape() -> None:
    tag = structural_tag(TOOLS, v11=False)
    assert tag is not None
    assert tag["triggers"] == [TOOL_CALLS]
    assert tag["structures"][0] == {
        "begin": TOOL_CALLS + ' [{"name": "get_weather", "arguments": ',
        "schema": WEATHER.parameters,
        "end": "}]",
    }


def test_structural_tag_output_parses_to_the_call() -> None:
    for v11_format in (True, False):
        tag = structural_tag(TOOLS, v11=v11_format)
        assert tag is not None
        for tool, s in zip(TOOLS, tag["structures"], strict=True):
            parsed = assert_invariant(factory, s["begin"] + TIME_ARGS + s["end"], rounds=5)
            assert parsed.content == ""
            assert parsed.calls == calls((tool.name, TIME_ARGS))


def test_marker_after_a_backslash_still_ends_the_call() -> None:
    text = v11("get_time", '{"tz": "a\\') + v11("get_time", "{}")
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", '{"tz": "a\\'), ("get_time", "{}"))


def test_a_name_over_the_limit_is_content() -> None:
    text = TOOL_CALLS + "x" * 400 + ARGS + "{}"
    parsed = assert_invariant(factory, text, rounds=3)
    assert parsed.content == text
    assert parsed.calls == []


def test_marker_inside_a_v3_array_starts_the_next_call() -> None:
    text = TOOL_CALLS + ' [{"name": "get_time", "arguments": {}' + v11("get_weather", "{}")
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", "{}"), ("get_weather", "{}"))
    assert parsed.content == ""
