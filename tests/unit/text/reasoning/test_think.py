"""`<think>` reasoning: the split of reasoning and content, invariance, cut texts."""

from __future__ import annotations

from unit.text.tools.invariance import assert_invariant, fuzz_texts

from homing.text.output import ContentDelta, ReasoningDelta
from homing.text.reasoning.think import ThinkParser


def in_reasoning() -> ThinkParser:
    return ThinkParser(True)


def not_in_reasoning() -> ThinkParser:
    return ThinkParser(False)


# Published shapes: DeepSeek-R1 (template ends with <think>) and Qwen3 (model writes it).
R1 = "Okay, 2 + 2 is 4. 😀\n</think>\n\nThe answer is **4**."
QWEN3 = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"


def test_an_answer_that_starts_in_reasoning_splits_at_the_end_tag() -> None:
    parsed = assert_invariant(in_reasoning, R1)
    assert parsed.reasoning == "Okay, 2 + 2 is 4. 😀\n"
    assert parsed.content == "\n\nThe answer is **4**."


def test_an_answer_that_writes_think_strips_the_tag() -> None:
    for factory in (in_reasoning, not_in_reasoning):
        parsed = assert_invariant(factory, QWEN3)
        assert parsed.reasoning == "\nThe user greets me.\n"
        assert parsed.content == "\n\nHello! How can I help?"


def test_a_plain_answer_not_in_reasoning_is_all_content() -> None:
    text = "Hello, <thin> and </think> are just text here."
    parsed = assert_invariant(not_in_reasoning, text)
    assert parsed.content == text
    assert parsed.reasoning == ""


def test_tags_after_the_end_tag_are_content() -> None:
    parsed = assert_invariant(in_reasoning, "a</think>b<think>c</think>d")
    assert parsed.reasoning == "a"
    assert parsed.content == "b<think>c</think>d"


def test_a_text_cut_before_the_end_tag_is_all_reasoning() -> None:
    parsed = assert_invariant(in_reasoning, "Thinking about it</thi")
    assert parsed.reasoning == "Thinking about it</thi"
    assert parsed.content == ""
    parsed = assert_invariant(not_in_reasoning, "<think>half")
    assert parsed.reasoning == "half"


def test_a_partial_end_tag_is_held_back_until_decided() -> None:
    parser = ThinkParser(True)
    assert parser.feed("abc</th") == [ReasoningDelta("abc")]
    assert parser.feed("ink>ok") == [ContentDelta("ok")]
    assert parser.finish() == []


def test_multibyte_reasoning_and_tool_markup_after_the_end_tag_pass_through() -> None:
    text = "東京 👍🏽 é</think><tool_call>\n{}</tool_call>"
    parsed = assert_invariant(in_reasoning, text)
    assert parsed.reasoning == "東京 👍🏽 é"
    assert parsed.content == "<tool_call>\n{}</tool_call>"


def test_fuzzed_texts_of_the_tags_never_raise_and_stay_invariant() -> None:
    fragments = ["<think>", "</think>", "<", "</", "<th", "\n", " ", "x", "😀", "think>"]
    for factory in (in_reasoning, not_in_reasoning):
        for text in fuzz_texts(fragments, seed=3, count=150):
            assert_invariant(factory, text, rounds=6)
