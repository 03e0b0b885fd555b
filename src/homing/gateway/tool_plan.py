"""What a chat request's tools and reasoning options make of its prompt, its engine
constraint and the parsing of its answers (`ToolPlan`), decided before the template runs.

Rules (OpenAI's API as SGLang and vLLM serve it):
- `tool_choice: "none"` (or no functions): the tools are not given to the template (as
  SGLang does), answers are not parsed for calls.
- `"auto"`: the tools go to the template (`tools=`, transformers' shape) and answers are
  parsed by the model's tool-call parser (`homing.text.parsers`); a model without one
  answers 400. A `strict` function constrains calls with the family's `structural_tag`.
- `"required"` / a named function: the engine is constrained to calls with a JSON schema
  (`homing.text.tools.json_array`), whatever the model's format, so even a weak model
  writes a well-formed call; `response_format` cannot be added to that (400).
- `parallel_tool_calls: false`: at most one call is reported (the rest of the text is
  dropped from the calls, as the schema of `"required"` allows one only).
- `reasoning_effort` and `chat_template_kwargs` go to the template when it reads them,
  else 400 `unsupported_parameter` by name. A model's reasoning parser splits the answer's
  reasoning off; the `<think>` family starts inside the reasoning when the prompt ends with
  `<think>` (the template opened it).
- Under a `json_schema` constraint (`"required"`, a named function, `response_format`) the
  engine writes JSON from the first token: no reasoning is split off and no model format
  (Harmony's included) is parsed around it. The gateway does not send SGLang's
  `require_reasoning`, which only a worker started with `--reasoning-parser` honours.

Planning copies and serializes the schemas, and `check(tokenizer)` walks them and scans the
tool texts for special-token text: for a request `plans_costly` says yes to, both run in the
encode thread with the template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from homing.fleet import ModelDispatch
from homing.gateway.errors import APIError, invalid
from homing.gateway.output import OutputPlan, ParserFactory
from homing.gateway.requests import ChatRequest, FunctionDefinition
from homing.gateway.schemas import check_parameters
from homing.text.parsers import think_parser_factory, tool_parser_factory, tool_structural_tag
from homing.text.tokenizer import TextTokenizer
from homing.text.tools.base import ToolSpec
from homing.text.tools.json_array import (
    JsonArrayParser,
    NamedFunctionParser,
    named_schema,
    required_schema,
)

RESERVED_VARIABLES = frozenset(
    {"messages", "add_generation_prompt", "bos_token", "eos_token", "pad_token", "tools",
     "raise_exception"}
)  # fmt: skip
"""Template variables the gateway sets itself; `chat_template_kwargs` cannot name them."""

THINK_OPEN = "<think>"

# Reasoning parsers of the `<think>` family that start inside the reasoning only when the
# prompt opened it (the rest also accept an answer that opens it itself).
_PROMPT_OPENED = frozenset({"deepseek_v31"})


def _unsupported(name: str, why: str) -> APIError:
    return invalid(f"'{name}' is not supported by this model: {why}.", name,
                   "unsupported_parameter")  # fmt: skip


@dataclass(frozen=True)
class ToolPlan:
    """One chat request's plan. `variables`: extra template variables (`tools`, the
    template's own kwargs). `json_schema` / `structural_tag`: the engine constraint as JSON
    text (at most one), None for none. `keeps_special`: answers are detokenized with special
    tokens kept (a parser reads markers a tokenizer may flag special; EOS stays hidden)."""

    variables: dict[str, Any] = field(default_factory=dict)
    json_schema: str | None = None
    structural_tag: str | None = None
    keeps_special: bool = False
    tools_factory: ParserFactory | None = None
    reasoning: str | None = None  # the model's reasoning parser name
    combined: bool = False
    legacy: bool = False
    max_calls: int | None = None
    functions: tuple[FunctionDefinition, ...] = ()
    tokenizer: TextTokenizer | None = None
    history: tuple[tuple[str, str], ...] = ()  # (param, text) of past calls and reasoning

    def check(self, tokenizer: TextTokenizer) -> None:
        """400 for a bad parameters schema (`homing.gateway.schemas`), or tool text that
        spells a special token (the template renders it as template input)."""
        where = "functions" if self.legacy else "tools"
        prefix = "functions.[{}]" if self.legacy else "tools.[{}].function"
        for index, function in enumerate(self.functions):
            param = prefix.format(index)
            if function.parameters is not None:
                check_parameters(function.parameters, f"{param}.parameters")
            texts = [function.description or ""]
            if function.parameters is not None:
                texts.extend(_strings(function.parameters))
            _check_plain(tokenizer, texts, param, where)
        for param, text in self.history:
            _check_plain(tokenizer, [text], param, "messages")

    def output(self, prompt_ids: Sequence[int]) -> OutputPlan | None:
        """How answers to the prompt `prompt_ids` are parsed; None: all text is content."""
        if self.json_schema is not None:  # JSON from the first token (module docstring)
            if self.combined or self.tools_factory is None:
                return None
            return OutputPlan(tools=self.tools_factory, legacy=self.legacy,
                              max_calls=self.max_calls, parses_calls=True)  # fmt: skip
        reasoning: ParserFactory | None = None
        if self.reasoning is not None and not self.combined and self.tokenizer is not None:
            opened = _opens_think(self.tokenizer, prompt_ids)
            if opened or self.reasoning not in _PROMPT_OPENED:
                reasoning = think_parser_factory(opened)
        tools = self.tools_factory
        if self.combined and tools is None and self.reasoning is not None:
            tools = tool_parser_factory(self.reasoning, ())  # Harmony without tools
        if tools is None and reasoning is None:
            return None
        return OutputPlan(
            tools=tools,
            reasoning=reasoning,
            combined=self.combined,
            legacy=self.legacy,
            max_calls=self.max_calls,
            parses_calls=self.tools_factory is not None,
        )


def _opens_think(tokenizer: TextTokenizer, prompt_ids: Sequence[int]) -> bool:
    """Whether the prompt ends with `<think>` (and whitespace): by id where `<think>` is one
    token (the usual case, no decode per request), else by the tail's text."""
    think = tokenizer.token_to_id(THINK_OPEN)
    if think is None:
        tail = tokenizer.decode(prompt_ids[-2:], skip_special_tokens=False)
        return tail.rstrip().endswith(THINK_OPEN)
    if prompt_ids and prompt_ids[-1] == think:
        return True
    return (
        len(prompt_ids) >= 2
        and prompt_ids[-2] == think
        and tokenizer.decode(prompt_ids[-1:], skip_special_tokens=False).isspace()
    )


def plans_costly(req: ChatRequest) -> bool:
    """Whether planning and checking `req`'s tools is work worth a thread: it declares
    functions the template gets, or its history holds calls, tool results or reasoning."""
    if req.declared_functions:
        return True
    return any(m.tool_call_id is not None or m.calls() or m.reasoning_content for m in req.messages)


def plan_tools(req: ChatRequest, model: ModelDispatch) -> ToolPlan:
    """The plan of `req` on `model`; raises `APIError` 400 for what the model cannot serve."""
    tokenizer = model.tokenizer
    variables = _template_kwargs(req, tokenizer)
    mode = req.tool_mode
    functions = tuple(req.declared_functions)
    specs = tuple(ToolSpec(f.name, f.parameters) for f in functions)
    history = tuple(_history(req))
    reasoning = model.reasoning_parser
    combined = reasoning == "gpt_oss" or model.tool_call_parser == "gpt_oss"
    common: dict[str, Any] = {
        "reasoning": reasoning,
        "combined": combined,
        "keeps_special": combined,  # Harmony's markers are special tokens
        "legacy": req.legacy_functions,
        "tokenizer": tokenizer,
        "history": history,
    }
    if mode == "none":  # the functions are checked all the same, as OpenAI does
        return ToolPlan(variables=variables, json_schema=req.json_schema_constraint,
                        functions=functions, **common)  # fmt: skip
    variables["tools"] = [
        {"type": "function", "function": _template_function(f)} for f in functions
    ]
    parallel = req.parallel_tool_calls is not False and not req.legacy_functions
    common.update(
        variables=variables,
        functions=functions,
        max_calls=None if parallel else 1,
    )
    where = "functions" if req.legacy_functions else "tools"
    choice = "function_call" if req.legacy_functions else "tool_choice"
    if mode in ("required", "named"):
        if req.response_format is not None and req.json_schema_constraint is not None:
            raise invalid(
                f"'response_format' cannot be combined with '{choice}' '{mode}': both "
                "constrain the answer.",
                "response_format",
            )
        if mode == "required":
            try:
                schema = required_schema(specs, parallel)
            except ValueError as exc:
                raise invalid(f"Invalid value for '{where}': {exc}.", where) from exc
            factory: ParserFactory = lambda: JsonArrayParser(specs)  # noqa: E731
        else:
            forced = req.forced_function
            assert forced is not None
            tool = next(s for s in specs if s.name == forced)
            schema = named_schema(tool)
            factory = lambda: NamedFunctionParser(specs, forced)  # noqa: E731
        common["max_calls"] = None if mode == "required" and parallel else 1
        # JSON from the first token: neither Harmony's channels nor its special tokens.
        common.update(combined=False, keeps_special=False)
        return ToolPlan(json_schema=json.dumps(schema), tools_factory=factory, **common)
    name = model.tool_call_parser
    if name is None:
        raise invalid(
            f"'{where}' with '{choice}' 'auto' needs a tool-call parser for model "
            f"'{req.model}', and none is configured (set tool_call_parser in its [[models]] "
            "entry, or send tool_choice 'required' or a named function).",
            where,
        )
    structural_tag = None
    strict = [i for i, f in enumerate(functions) if f.strict]
    if strict:
        tag = tool_structural_tag(name, specs)
        param = (
            f"functions.[{strict[0]}].strict"
            if req.legacy_functions
            else f"tools.[{strict[0]}].function.strict"
        )
        if tag is None:
            raise _unsupported(param, f"the '{name}' format cannot be constrained")
        if req.json_schema_constraint is not None:
            raise invalid(
                "'response_format' cannot be combined with strict functions: both constrain "
                "the answer.",
                "response_format",
            )
        structural_tag = json.dumps(tag)
    # The parser reads the family's markers, which some tokenizers flag special (Mistral's
    # [TOOL_CALLS], Llama 3's <|python_tag|>): they stay in the text, as SGLang keeps them.
    common["keeps_special"] = True
    return ToolPlan(
        json_schema=req.json_schema_constraint,
        structural_tag=structural_tag,
        tools_factory=tool_parser_factory(name, specs),
        **common,
    )


def _template_function(function: FunctionDefinition) -> dict[str, Any]:
    out: dict[str, Any] = {"name": function.name}
    if function.description is not None:
        out["description"] = function.description
    out["parameters"] = (
        function.parameters if function.parameters is not None else {"type": "object"}
    )
    return out


def _template_kwargs(req: ChatRequest, tokenizer: TextTokenizer) -> dict[str, Any]:
    """`reasoning_effort` and `chat_template_kwargs` as template variables; 400 for a name
    the template does not read or the gateway sets."""
    variables: dict[str, Any] = {}
    if req.reasoning_effort is None and not req.chat_template_kwargs:
        return variables
    readable = tokenizer.template_variables - RESERVED_VARIABLES
    if req.reasoning_effort is not None:
        if "reasoning_effort" not in readable:
            raise _unsupported("reasoning_effort", "its chat template does not take it")
        variables["reasoning_effort"] = req.reasoning_effort
    for key, value in (req.chat_template_kwargs or {}).items():
        if key not in readable:
            param = "chat_template_kwargs"
            raise invalid(
                f"Invalid value for '{param}': the model's chat template does not read "
                f"'{key[:64]}'.",
                param,
                "unsupported_parameter",
            )
        variables[key] = value
    return variables


def _history(req: ChatRequest) -> Iterator[tuple[str, str]]:
    """(param, text) of what past turns' calls and reasoning give the template as input."""
    for index, message in enumerate(req.messages):
        for position, call in enumerate(message.calls()):
            param = f"messages.[{index}].tool_calls.[{position}]"
            yield f"{param}.function.name", call.function.name
            yield f"{param}.function.arguments", call.function.arguments
            yield f"{param}.id", call.id
        if message.tool_call_id is not None:
            yield f"messages.[{index}].tool_call_id", message.tool_call_id
        if message.reasoning_content:
            yield f"messages.[{index}].reasoning_content", message.reasoning_content


def _strings(node: Any) -> Iterator[str]:
    """Every key and string value inside a JSON value (iteratively)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for key, value in item.items():
                yield key
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def _check_plain(tokenizer: TextTokenizer, texts: Sequence[str], param: str, where: str) -> None:
    for text in texts:
        if text and tokenizer.holds_special(text):
            raise invalid(
                f"Invalid value for '{param}': text given to the chat template must not hold "
                f"special-token text (in '{where}').",
                param,
            )
