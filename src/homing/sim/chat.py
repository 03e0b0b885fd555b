"""What a chat prompt of the served template asks for, read from its token ids, and the texts
the simulated worker answers with in that template's own format.

Rule of this file: reading is cheap for plain prompts (a few index checks, no decode): only a
prompt that ends with the generation prompt and opens with the tools block, or ends with
`<think>` or right after a tool result, is decoded, and then only its parts that matter.

The served template (`homing/text/templates/chat_template.jinja`, DeepSeek V3.1's tool
format) renders: BOS, the tools block `<｜begin▁sys｜>## Tools\\nYou can call these
functions:\\n\\n### NAME\\nDescription: ...\\nParameters: {json}\\n ...<｜end▁sys｜>` (its call
instructions hold `<｜tool▁calls▁begin｜>`), then per message `<｜User｜>text`,
`<｜Assistant｜>text[calls]<eos>`, `<｜tool▁output▁begin｜>text<｜tool▁output▁end｜>`, and the
generation prompt `<｜Assistant｜>` (plus `<think>` in thinking mode). An assistant's calls are
`<｜tool▁calls▁begin｜>(<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>)+
<｜tool▁calls▁end｜>`; a thinking answer is reasoning, `</think>`, then the answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

TOOLS_HEADER = "## Tools"
"""How the tools block's text starts."""

TOOL_RESULT_QUOTE_CHARS = 80
"""How much of a tool result an answer quotes (characters; longer ones are cut, with "…")."""

REASONING_CORPUS: tuple[str, ...] = (
    "The user wants a short answer, so I will keep it brief.",
    "Let me look at what the prompt gives me before I answer.",
    "First I check the question, then I pick the simplest answer.",
    "There is no need for a long explanation here.",
    "I should answer in plain words and stop.",
    "Let me think about which part of the question matters most.",
)
"""The sentences a thinking answer reasons with (our own text)."""

_STOPWORDS = frozenset(
    "a an and are can could did do does for from give how i in is it its me my of on or "
    "please show tell that the this to today tomorrow was what when where which who why will "
    "with would you your".split()
)
_WORD = re.compile(r"[^\W\d_][\w'-]*")
_TOOL_ENTRY = re.compile(
    r"\n### (?P<name>[^\n]+)\n(?:Description: (?P<description>.*?)\n)?"
    r"Parameters: (?P<params>[^\n]*)\n",
    re.DOTALL,
)


class ChatTokenizer(Protocol):
    """What reading a prompt needs from the served tokenizer."""

    def token_to_id(self, token: str | None) -> int | None: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class ChatTokens:
    """The template's special token ids (`from_tokenizer`: None when one is missing)."""

    bos: int | None
    user: int
    assistant: int
    begin_sys: int
    end_sys: int
    think: int
    think_end: int
    tool_calls_begin: int
    tool_calls_end: int
    tool_call_begin: int
    tool_call_end: int
    tool_sep: int
    tool_output_begin: int
    tool_output_end: int

    @classmethod
    def from_tokenizer(cls, tokenizer: ChatTokenizer, bos: int | None) -> ChatTokens | None:
        names = {
            "user": "<｜User｜>",
            "assistant": "<｜Assistant｜>",
            "begin_sys": "<｜begin▁sys｜>",
            "end_sys": "<｜end▁sys｜>",
            "think": "<think>",
            "think_end": "</think>",
            "tool_calls_begin": "<｜tool▁calls▁begin｜>",
            "tool_calls_end": "<｜tool▁calls▁end｜>",
            "tool_call_begin": "<｜tool▁call▁begin｜>",
            "tool_call_end": "<｜tool▁call▁end｜>",
            "tool_sep": "<｜tool▁sep｜>",
            "tool_output_begin": "<｜tool▁output▁begin｜>",
            "tool_output_end": "<｜tool▁output▁end｜>",
        }
        ids = {key: tokenizer.token_to_id(text) for key, text in names.items()}
        if any(value is None for value in ids.values()):
            return None
        return cls(bos=bos, **ids)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Tool:
    """A tool the prompt declares: its name and parameters schema (an object schema)."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class PromptFacts:
    """What a chat prompt asks for.

    `thinking`: it ends with `<think>` (the answer reasons first). `tools`: the tools it
    declares, when the last turn is the user's (empty otherwise). `user_text`: that user
    message's text ("" when none was read). `tool_output`: the last tool result's text when
    the prompt ends right after it, else None.
    """

    thinking: bool = False
    tools: tuple[Tool, ...] = ()
    user_text: str = ""
    tool_output: str | None = None


def read_prompt(
    input_ids: Sequence[int], tokens: ChatTokens, decode: Callable[[Sequence[int]], str]
) -> PromptFacts | None:
    """The facts of a chat prompt, or None for a prompt that asks for nothing but text (see
    the module docstring for what is decoded)."""
    end = len(input_ids)
    thinking = end > 0 and input_ids[end - 1] == tokens.think
    if thinking:
        end -= 1
    if end < 2 or input_ids[end - 1] != tokens.assistant:
        return PromptFacts(thinking=True) if thinking else None
    before = input_ids[end - 2]
    if before == tokens.tool_output_end:
        start = _last_index(input_ids, tokens.tool_output_begin, end - 2)
        output = decode(input_ids[start + 1 : end - 2]) if start >= 0 else ""
        return PromptFacts(thinking=thinking, tool_output=output)
    tools = _declared_tools(input_ids, tokens, decode)
    if not tools:
        return PromptFacts(thinking=True) if thinking else None
    turn = _last_turn(input_ids, tokens, end - 1)
    if turn < 0 or input_ids[turn] != tokens.user:
        return PromptFacts(thinking=thinking) if thinking else None
    return PromptFacts(
        thinking=thinking, tools=tools, user_text=decode(input_ids[turn + 1 : end - 1])
    )


def last_user_text(
    input_ids: Sequence[int], tokens: ChatTokens | None, decode: Callable[[Sequence[int]], str]
) -> str:
    """The last user message's text, or the prompt's last 64 tokens when it has no user turn
    (a raw completion prompt); for the words of a constrained answer."""
    if tokens is not None:
        start = _last_index(input_ids, tokens.user, len(input_ids))
        if start >= 0:
            stop = start + 1
            while stop < len(input_ids) and input_ids[stop] not in (
                tokens.assistant,
                tokens.user,
                tokens.end_sys,
            ):
                stop += 1
            return decode(input_ids[start + 1 : stop])
    return decode(input_ids[-64:])


def _last_index(ids: Sequence[int], token: int, before: int) -> int:
    for i in range(before - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1


def _last_turn(ids: Sequence[int], tokens: ChatTokens, before: int) -> int:
    """Index of the last role marker (user, assistant, tool result end) before `before`."""
    markers = (tokens.user, tokens.assistant, tokens.tool_output_end)
    for i in range(before - 1, -1, -1):
        if ids[i] in markers:
            return i
    return -1


def _declared_tools(
    ids: Sequence[int], tokens: ChatTokens, decode: Callable[[Sequence[int]], str]
) -> tuple[Tool, ...]:
    """The tools of the prompt's opening tools block (none unless the prompt opens with a
    system block that holds the tool-calls token)."""
    first = 1 if tokens.bos is not None and ids and ids[0] == tokens.bos else 0
    if len(ids) <= first or ids[first] != tokens.begin_sys:
        return ()
    try:
        close = ids.index(tokens.end_sys, first + 1)  # type: ignore[call-arg]
    except ValueError:
        return ()
    block = ids[first + 1 : close]
    if tokens.tool_calls_begin not in block:
        return ()
    return parse_tools(decode(block))


def parse_tools(text: str) -> tuple[Tool, ...]:
    """The tools a tools block's text declares (entries whose parameters are not JSON keep an
    empty object schema)."""
    if not text.startswith(TOOLS_HEADER):
        return ()
    tools = []
    for match in _TOOL_ENTRY.finditer(text):
        try:
            params = json.loads(match.group("params"))
        except json.JSONDecodeError:
            params = {}
        if not isinstance(params, dict):
            params = {}
        tools.append(Tool(match.group("name").strip(), params))
    return tuple(tools)


def argument_words(text: str) -> list[str]:
    """Words of a user message a tool call's string arguments are made of: capitalised words
    past the first (names, places) first, then the other words that are not stopwords."""
    words = _WORD.findall(text)
    names = [w for i, w in enumerate(words) if i > 0 and w[0].isupper()]
    others = [w for w in words if w.lower() not in _STOPWORDS and w not in names]
    chosen = names or others
    return list(dict.fromkeys(chosen))


def object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters as an object schema (an empty or type-less one describes an
    object)."""
    if parameters.get("type") == "object" or "$ref" in parameters or "anyOf" in parameters:
        return parameters
    return {**parameters, "type": "object"}


def quote_tool_output(output: str) -> str:
    """The answer to a tool result: "The tool returned: ..." with the result, whitespace
    collapsed, cut at `TOOL_RESULT_QUOTE_CHARS`."""
    text = " ".join(output.split())
    if len(text) > TOOL_RESULT_QUOTE_CHARS:
        text = text[: TOOL_RESULT_QUOTE_CHARS - 1].rstrip() + "…"
    return f"The tool returned: {text}" if text else "The tool returned nothing."
