"""DeepSeek V3 / R1 tool calls.

Format (DeepSeek-V3, DeepSeek-V3-0324, DeepSeek-R1, DeepSeek-R1-0528; see their
`tokenizer_config.json` chat templates):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {ARGS}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ...```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The header is `function<｜tool▁sep｜>NAME` up to the line "```json"; the arguments are the
model's text from the `{` after it to the next special token (normally
`<｜tool▁call▁end｜>`), verbatim, less the closing "\\n```" fence. Calls are separated by a
line break (any whitespace is allowed between the tokens). A `<｜tool▁call▁begin｜>`
without the section's begin token also opens a call.

Rule of the file: `SpecialTokenParser` (see `homing.text.tools._special_tokens`) with
DeepSeek's tokens and the fenced JSON; malformed output (a type other than `function`, no
fence line) follows `homing.text.tools.base`.
"""

from __future__ import annotations

from collections.abc import Sequence

from homing.text.tools._schemas import legacy_structural_tag
from homing.text.tools._special_tokens import SpecialTokenParser
from homing.text.tools.base import ToolSpec

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
FENCE_OPEN = "```json\n"
FENCE_CLOSE = "\n```"


class DeepSeekV3Parser(SpecialTokenParser):
    """Incremental parser of DeepSeek V3 / R1 tool calls."""

    SECTION_BEGINS = (CALLS_BEGIN,)
    SECTION_ENDS = (CALLS_END,)
    CALL_BEGIN = CALL_BEGIN
    HEADER_END = FENCE_OPEN
    CALL_END = CALL_END
    TOKENS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
    HEADER_TOKENS = (SEP,)
    ARGS_SUFFIX = FENCE_CLOSE

    def name_of(self, header: str) -> str | None:
        """`function<｜tool▁sep｜>NAME` then a line break: the name, or None."""
        kind, sep, name = header.partition(SEP)
        name = name.strip()
        if not sep or kind.strip() != "function" or not name or "\n" in name:
            return None
        return name


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """The legacy `structural_tag` constraint of one call: triggered by
    `<｜tool▁call▁begin｜>`, `begin` is
    `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n`, the schema the tool's
    parameters (any object when None), `end` "\\n```<｜tool▁call▁end｜>".
    Unlike SGLang's (which puts the section tokens in begin and end, so one call per
    section), the section tokens stay free text, so parallel calls stay possible. None
    without tools."""
    return legacy_structural_tag(
        tools,
        lambda name: CALL_BEGIN + "function" + SEP + name + "\n" + FENCE_OPEN,
        FENCE_CLOSE + CALL_END,
        CALL_BEGIN,
    )
