"""A past tool call's arguments as chat templates read them.

Templates read an assistant turn's `tool_calls[].function.arguments` in one of two ways.
transformers' convention (Llama 3.x, Qwen, Mistral) is a mapping, which the template
serializes with `tojson` or walks with `items()`; SGLang and vLLM parse the request's JSON
text into one. DeepSeek's templates instead concatenate the text (`'...' + arguments`),
which a mapping would break. `TemplateArguments` serves both: the parsed object, whose text
(`+`, `~`, `string`, `{{ }}`) is the JSON text the model wrote, verbatim, so a concatenating
template replays the model's own tokens exactly.
"""

from __future__ import annotations

import json
from typing import Any


class TemplateArguments(dict[str, Any]):
    """A call's arguments object (a dict) whose text is the JSON it was parsed from (kept in
    `_text`: the sandbox hides it, so `arguments.text` is still the argument `text`)."""

    __slots__ = ("_text",)

    def __init__(self, value: dict[str, Any], text: str) -> None:
        super().__init__(value)
        self._text = text

    def __str__(self) -> str:
        return self._text

    def __add__(self, other: object) -> str:
        if not isinstance(other, str):
            return NotImplemented
        return self._text + other

    def __radd__(self, other: object) -> str:
        if not isinstance(other, str):
            return NotImplemented
        return other + self._text


def template_arguments(text: str) -> TemplateArguments | str:
    """`text`, a call's arguments as JSON text, for a chat template: `TemplateArguments`
    when it is a JSON object, else `text` itself (a model may have written broken JSON, and
    the history replays it)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return TemplateArguments(value, text) if isinstance(value, dict) else text
