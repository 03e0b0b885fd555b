"""DeepSeek V3.1 / V3.2 tool calls (the format of homing's own served chat template).

Format (DeepSeek-V3.1, DeepSeek-V3.1-Terminus, DeepSeek-V3.2-Exp; see
`homing/text/templates/chat_template.jinja` and the models' `tokenizer_config.json`):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(without the line break: calls follow one another; whitespace between the tokens is
allowed). The name is the text between `<｜tool▁call▁begin｜>` and `<｜tool▁sep｜>`,
stripped; the arguments are the model's text from the `{` after the separator to the next
special token (normally `<｜tool▁call▁end｜>`), verbatim. A `<｜tool▁call▁begin｜>` without
the section's begin token also opens a call.

Rule of the file: `SpecialTokenParser` (see `homing.text.tools._special_tokens`) with
DeepSeek's tokens; malformed output follows `homing.text.tools.base`.
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


class DeepSeekV31Parser(SpecialTokenParser):
    """Incremental parser of DeepSeek V3.1 tool calls."""

    SECTION_BEGINS = (CALLS_BEGIN,)
    SECTION_ENDS = (CALLS_END,)
    CALL_BEGIN = CALL_BEGIN
    HEADER_END = SEP
    CALL_END = CALL_END
    TOKENS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)

    def name_of(self, header: str) -> str | None:
        """The header is the name itself (whitespace around it is ignored)."""
        return header.strip() or None


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """The legacy `structural_tag` constraint of one call (SGLang's DeepSeek V3.1 shape):
    triggered by `<｜tool▁call▁begin｜>`, `begin` is `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>`,
    the schema the tool's parameters (any object when None), `end` `<｜tool▁call▁end｜>`;
    the section tokens around the calls stay free text. None without tools."""
    return legacy_structural_tag(tools, lambda name: CALL_BEGIN + name + SEP, CALL_END, CALL_BEGIN)
