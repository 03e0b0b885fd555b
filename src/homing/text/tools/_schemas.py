"""JSON-Schema and structural-tag helpers the tool-call formats share (private to the
package): a tool's arguments schema, and SGLang's legacy `structural_tag` built from a
format's call `begin`, `end` and trigger strings."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from homing.text.tools.base import ToolSpec


def arguments_schema(tool: ToolSpec) -> dict:
    """The JSON Schema of a tool's arguments: its `parameters` (a copy), or any object."""
    return copy.deepcopy(tool.parameters) if tool.parameters is not None else {"type": "object"}


def legacy_structural_tag(
    tools: Sequence[ToolSpec], begin: Callable[[str], str], end: str, trigger: str
) -> dict | None:
    """SGLang's legacy `structural_tag` constraint (xgrammar's triggered tags): once the
    model writes `trigger`, it must write `begin(name)` for a declared function, arguments
    that match its schema, then `end`; text outside is free. None without tools."""
    if not tools:
        return None
    return {
        "type": "structural_tag",
        "structures": [
            {"begin": begin(tool.name), "schema": arguments_schema(tool), "end": end}
            for tool in tools
        ],
        "triggers": [trigger],
    }
