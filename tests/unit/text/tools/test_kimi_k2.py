"""KimiK2Parser: `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{ARGS}`."""

from __future__ import annotations

from functools import partial

from homing.text.output import CallStart, merge
from homing.text.tools.kimi_k2 import (
    ARGUMENT_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_BEGIN_SINGULAR,
    SECTION_END,
    SECTION_END_SINGULAR,
    KimiK2Parser,
    structural_tag,
)
from tests.unit.text.tools.cases import TIME_ARGS, TRICKY_ARGS, calls, fuzz
from tests.unit.text.tools.invariance import TOOLS, WEATHER, assert_invariant

factory = partial(KimiK2Parser, TOOLS)


def call(name: str, args: str, idx: int = 0) -> str:
    """One call as Kimi K2 writes it."""
    return f"{CALL_BEGIN}functions.{name}:{idx}{ARGUMENT_BEGIN}{args}{CALL_END}"


def section(*calls_text: str) -> str:
    """Calls inside the tool-calls section."""
    return SECTION_BEGIN + "".join(calls_text) + SECTION_END


WEATHER_CALL = call("get_weather", TRICKY_ARGS, 0)
TIME_CALL = call("get_time", TIME_ARGS, 1)


def test_plain_answer_is_content() -> None:
    text = "It is <|sunny|> and functions.get_time:0 is a name."
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_text_before_a_call_stays_content() -> None:
    parsed = assert_invariant(factory, "Checking.\n" + section(WEATHER_CALL))
    assert parsed.content == "Checking.\n"
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_one_call_gives_name_and_verbatim_arguments() -> None:
    parsed = assert_invariant(factory, section(WEATHER_CALL))
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_parallel_calls_are_parsed_in_order() -> None:
    text = section(WEATHER_CALL, TIME_CALL, call("web.search-v2", "{}", 2))
    parsed = assert_invariant(factory, text)
    assert parsed.content == ""
    assert parsed.calls == calls(
        ("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS), ("web.search-v2", "{}")
    )


def test_two_calls_in_one_chunk_both_parsed() -> None:
    events = KimiK2Parser(TOOLS).feed(section(WEATHER_CALL, TIME_CALL))
    assert [e for e in events if isinstance(e, CallStart)] == [
        CallStart(0, "get_weather"),
        CallStart(1, "get_time"),
    ]
    assert merge(events).calls == calls(("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS))


def test_singular_section_tokens_and_missing_prefix_are_accepted() -> None:
    text = (
        SECTION_BEGIN_SINGULAR
        + "\n"
        + f"{CALL_BEGIN}get_time:7{ARGUMENT_BEGIN}{TIME_ARGS}{CALL_END}"
        + "\n"
        + SECTION_END_SINGULAR
    )
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", TIME_ARGS))
    assert parsed.content.strip() == ""


def test_text_after_the_section_is_content() -> None:
    parsed = assert_invariant(factory, section(TIME_CALL) + "Done.")
    assert parsed.content == "Done."
    assert parsed.calls == calls(("get_time", TIME_ARGS))


def test_arguments_cut_mid_escape_and_mid_unicode_are_invariant() -> None:
    for args in ('{"q": "a\\"b"}', '{"q": "\\u00e9\\ud83d\\ude00"}', '{"q": "é😀\\\\"}'):
        parsed = assert_invariant(factory, section(call("get_weather", args)))
        assert parsed.calls == calls(("get_weather", args))


def test_call_cut_at_length_leaves_partial_arguments() -> None:
    text = section(WEATHER_CALL)
    cut = text.index("😀") + 1
    parsed = assert_invariant(factory, text[:cut])
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS[: TRICKY_ARGS.index("😀") + 1]))


def test_call_cut_right_after_its_header_is_the_call_with_no_arguments() -> None:
    """A cut after the whole header (the name declared, the arguments not begun) is that
    call, as a cut inside its arguments is: the format's tokens never become content."""
    for space in ("", "\n"):
        parsed = assert_invariant(
            factory, SECTION_BEGIN + CALL_BEGIN + "functions.get_time:0" + ARGUMENT_BEGIN + space
        )
        assert parsed.content == ""
        assert parsed.calls == calls(("get_time", ""))


def test_cut_inside_the_header_gives_the_text_back() -> None:
    text = SECTION_BEGIN + CALL_BEGIN + "functions.get_time:"
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_undeclared_function_is_content_verbatim() -> None:
    text = section(call("delete_all", "{}"))
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_an_id_without_a_counter_is_content() -> None:
    text = section(f"{CALL_BEGIN}functions.get_time{ARGUMENT_BEGIN}{{}}{CALL_END}")
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_garbage_after_the_argument_token_is_content() -> None:
    text = section(f"{CALL_BEGIN}functions.get_time:0{ARGUMENT_BEGIN}oops{CALL_END}")
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_fuzzed_texts_never_raise_and_stay_invariant() -> None:
    markers = (
        SECTION_BEGIN,
        SECTION_END,
        SECTION_BEGIN_SINGULAR,
        CALL_BEGIN,
        ARGUMENT_BEGIN,
        CALL_END,
        "functions.",
        "get_time:0",
        "<|tool_",
        WEATHER_CALL,
        TIME_CALL,
    )
    assert fuzz(factory, markers, seed=2) > 0


def test_structural_tag_has_sglang_shape() -> None:
    tag = structural_tag(TOOLS)
    assert tag is not None
    assert tag["type"] == "structural_tag"
    assert tag["triggers"] == [CALL_BEGIN]
    assert tag["structures"][0] == {
        "begin": CALL_BEGIN + "functions.get_weather:0" + ARGUMENT_BEGIN,
        "schema": WEATHER.parameters,
        "end": CALL_END,
    }
    assert tag["structures"][2]["schema"] == {"type": "object"}
    assert structural_tag(()) is None


def test_structural_tag_output_parses_to_the_call() -> None:
    tag = structural_tag(TOOLS)
    assert tag is not None
    for tool, s in zip(TOOLS, tag["structures"], strict=True):
        parsed = assert_invariant(factory, s["begin"] + TIME_ARGS + s["end"], rounds=5)
        assert parsed.content == ""
        assert parsed.calls == calls((tool.name, TIME_ARGS))


def test_a_header_over_the_name_limit_is_content() -> None:
    text = section(call("x" * 400, "{}"))
    parsed = assert_invariant(factory, text, rounds=3)
    assert parsed.content == text
    assert parsed.calls == []
