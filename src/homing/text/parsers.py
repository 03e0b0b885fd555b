"""The output parsers by name: tool-call parsers per model family, reasoning parsers, and
which of them a chat template implies.

Names follow SGLang's `--tool-call-parser` / `--reasoning-parser` where one exists. A model's
parsers come from its config (`[[models]] tool_call_parser`, `reasoning_parser`) or, when it
sets none, from its chat template (`detect_tool_parser`, `detect_reasoning_parser`), which
is unambiguous for the formats below: each writes its own marker text.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol, cast

from homing.text.output import OutputParser
from homing.text.tools.base import ToolSpec

TOOL_PARSERS: dict[str, tuple[str, str]] = {
    "deepseek_v3": ("homing.text.tools.deepseek_v3", "DeepSeekV3Parser"),
    "deepseek_v31": ("homing.text.tools.deepseek_v31", "DeepSeekV31Parser"),
    "kimi_k2": ("homing.text.tools.kimi_k2", "KimiK2Parser"),
    "mistral": ("homing.text.tools.mistral", "MistralParser"),
    "llama3": ("homing.text.tools.llama3", "Llama3JsonParser"),
    "hermes": ("homing.text.tools.hermes", "HermesParser"),
    "qwen25": ("homing.text.tools.hermes", "HermesParser"),
    "qwen3": ("homing.text.tools.hermes", "HermesParser"),
    "qwen3_coder": ("homing.text.tools.qwen3_coder", "Qwen3CoderParser"),
    "pythonic": ("homing.text.tools.pythonic", "PythonicParser"),
    "gpt_oss": ("homing.text.tools.gpt_oss", "GptOssParser"),
}
"""Tool-call parser name -> (module, class); each class is built as `Class(tools)`, and each
module is a `ToolFormat`."""

REASONING_PARSERS = ("think", "deepseek_r1", "qwen3", "deepseek_v31", "gpt_oss")
"""Reasoning parser names: all but gpt_oss are `<think>`...`</think>` (the prompt's last
token decides whether the answer starts inside the reasoning); gpt_oss is Harmony's
analysis channel, parsed by the gpt_oss tool-call parser at the same time."""

# Template text -> parser, most specific first (a template holding the first marker is of
# that family whatever else it holds).
_TOOL_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>",), "gpt_oss"),
    (("<｜tool▁call▁begin｜>", "```json"), "deepseek_v3"),
    (("<｜tool▁call▁begin｜>",), "deepseek_v31"),
    (("<|tool_call_begin|>",), "kimi_k2"),
    (("<tool_call>", "<function="), "qwen3_coder"),
    (("<tool_call>",), "hermes"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<|python_tag|>",), "llama3"),
)


def tool_parser_factory(name: str, tools: Sequence[ToolSpec]) -> Callable[[], OutputParser]:
    """A factory of fresh `name` parsers for `tools`. Raises KeyError for an unknown name."""
    module, cls = TOOL_PARSERS[name]
    return partial(getattr(importlib.import_module(module), cls), tuple(tools))


class ToolFormat(Protocol):
    """What each module of `TOOL_PARSERS` offers beside its parser class."""

    def structural_tag(self, tools: Sequence[ToolSpec]) -> dict | None:
        """SGLang's `structural_tag` constraint of the family's calls of `tools` (None: the
        format cannot be constrained so, or no tools)."""
        ...


def tool_structural_tag(name: str, tools: Sequence[ToolSpec]) -> dict | None:
    """The `name` family's `structural_tag` for `tools` (None: its format cannot be
    constrained). Raises KeyError for an unknown name."""
    module = cast(ToolFormat, importlib.import_module(TOOL_PARSERS[name][0]))
    return module.structural_tag(tools)


def think_parser_factory(starts_in_reasoning: bool) -> Callable[[], OutputParser]:
    """A factory of `<think>` reasoning parsers."""
    from homing.text.reasoning.think import ThinkParser

    return partial(ThinkParser, starts_in_reasoning)


def detect_tool_parser(template: str | None) -> str | None:
    """The tool-call parser `template` implies, else None (it renders no known format)."""
    if not template:
        return None
    for markers, name in _TOOL_MARKERS:
        if all(marker in template for marker in markers):
            return name
    return None


def detect_reasoning_parser(template: str | None) -> str | None:
    """The reasoning parser `template` implies: "gpt_oss" for Harmony, "deepseek_v31" for a
    DeepSeek template that writes `<think>` (its answers reason only after a prompt that
    opened `<think>`), "think" for another template that writes `<think>`, else None."""
    if not template:
        return None
    if "<|channel|>" in template:
        return "gpt_oss"
    if "<think>" in template and "<｜Assistant｜>" in template:
        return "deepseek_v31"  # thinks only when the prompt opens <think>
    if "<think>" in template:
        return "think"
    return None
