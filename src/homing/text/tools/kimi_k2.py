"""Kimi K2 tool calls.

Format (Kimi-K2-Instruct, Kimi-K2-Instruct-0905, Kimi-K2-Thinking; see Moonshot's
`docs/tool_call_guidance.md` of Kimi-K2-Instruct):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{ARGS}<|tool_call_end|>
    <|tool_call_begin|>...<|tool_call_end|><|tool_calls_section_end|>

The header between `<|tool_call_begin|>` and `<|tool_call_argument_begin|>` is the call id
`functions.NAME:IDX` (the `functions.` prefix may be missing; IDX is decimal digits; the id
itself is not kept: events carry no ids). The arguments are the model's text from the `{`
to the next special token (normally `<|tool_call_end|>`), verbatim. Whitespace is allowed
between the tokens; the singular `<|tool_call_section_begin|>` / `_end|>` spelling is
accepted too, and a `<|tool_call_begin|>` without the section's begin token also opens a
call. A bare counter id (no name, which SGLang guesses from the arguments) is malformed.

Rule of the file: `SpecialTokenParser` (see `homing.text.tools._special_tokens`) with
Kimi's tokens; malformed output follows `homing.text.tools.base`.
"""

from __future__ import annotations

from collections.abc import Sequence

from homing.text.tools._schemas import legacy_structural_tag
from homing.text.tools._special_tokens import SpecialTokenParser
from homing.text.tools.base import ToolSpec

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
SECTION_BEGIN_SINGULAR = "<|tool_call_section_begin|>"
SECTION_END_SINGULAR = "<|tool_call_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"


class KimiK2Parser(SpecialTokenParser):
    """Incremental parser of Kimi K2 tool calls."""

    SECTION_BEGINS = (SECTION_BEGIN, SECTION_BEGIN_SINGULAR)
    SECTION_ENDS = (SECTION_END, SECTION_END_SINGULAR)
    CALL_BEGIN = CALL_BEGIN
    HEADER_END = ARGUMENT_BEGIN
    CALL_END = CALL_END
    TOKENS = (
        SECTION_BEGIN,
        SECTION_END,
        SECTION_BEGIN_SINGULAR,
        SECTION_END_SINGULAR,
        CALL_BEGIN,
        ARGUMENT_BEGIN,
        CALL_END,
    )

    def name_of(self, header: str) -> str | None:
        """`functions.NAME:IDX` (or `NAME:IDX`): the name, or None."""
        call_id = header.strip()
        call_id = call_id.removeprefix("functions.")
        name, colon, idx = call_id.rpartition(":")
        if not colon or not idx.isascii() or not idx.isdigit() or not name:
            return None
        return name


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """The legacy `structural_tag` constraint of one call: triggered by `<|tool_call_begin|>`,
    `begin` is `<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>`, the schema
    the tool's parameters (any object when None), `end` `<|tool_call_end|>`. The legacy shape
    has fixed begin strings, so the call index is pinned to 0 for every call (the parser
    ignores it; SGLang pins it the same way); the section tokens stay free text, so
    parallel calls stay possible. None without tools."""
    return legacy_structural_tag(
        tools,
        lambda name: CALL_BEGIN + "functions." + name + ":0" + ARGUMENT_BEGIN,
        CALL_END,
        CALL_BEGIN,
    )
