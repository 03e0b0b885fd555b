"""A past call's arguments render as each template style expects (`template_arguments`)."""

from __future__ import annotations

import pytest

from homing.text.call_arguments import TemplateArguments, template_arguments
from homing.text.tokenizer import TextTokenizer

# The argument-rendering lines of published templates (their tool-call loops, trimmed).
LLAMA_31 = (
    "{% for m in messages %}{% for c in m.tool_calls %}"
    '{{ \'{"name": "\' + c.function.name + \'", "parameters": \' }}'
    '{{ c.function.arguments | tojson }}{{ "}" }}{% endfor %}{% endfor %}'
)
QWEN_3 = (
    "{% for m in messages %}{% for c in m.tool_calls %}"
    "{% if c.function.arguments is string %}{{ c.function.arguments }}"
    "{% else %}{{ c.function.arguments | tojson }}{% endif %}{% endfor %}{% endfor %}"
)
DEEPSEEK_V31 = (
    "{% for m in messages %}{% for c in m.tool_calls %}"
    "{{ '<call>' + c.function.name + '<sep>' + c.function.arguments + '<end>' }}"
    "{% endfor %}{% endfor %}"
)
ITEMS = (
    "{% for m in messages %}{% for c in m.tool_calls %}"
    "{% for k, v in c.function.arguments | items %}{{ k }}={{ v }};{% endfor %}"
    "{% endfor %}{% endfor %}"
)
WRITTEN = '{"city":"Paris","days":2}'  # compact, as a model may write it


def _render(tiny_files: dict[str, bytes], template: str, arguments: str) -> str:
    tokenizer = TextTokenizer.from_files({**tiny_files, "chat_template.jinja": template.encode()})
    function = {"name": "get_weather", "arguments": template_arguments(arguments)}
    call = {"id": "c1", "type": "function", "function": function}
    return tokenizer.apply_chat_template(
        [{"role": "assistant", "content": "", "tool_calls": [call]}], add_generation_prompt=False
    )


def test_a_tojson_template_gets_the_object_as_transformers_passes_it(
    tiny_files: dict[str, bytes],
) -> None:
    """Llama 3.1's `arguments | tojson` writes the object, not a JSON string of it."""
    rendered = _render(tiny_files, LLAMA_31, WRITTEN)
    assert rendered == '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
    assert _render(tiny_files, QWEN_3, WRITTEN) == '{"city": "Paris", "days": 2}'
    assert _render(tiny_files, ITEMS, WRITTEN) == "city=Paris;days=2;"


def test_a_concatenating_template_replays_the_model_text_verbatim(
    tiny_files: dict[str, bytes],
) -> None:
    """DeepSeek's `'...' + arguments + '...'` gets the text the model wrote, spacing kept."""
    assert _render(tiny_files, DEEPSEEK_V31, WRITTEN) == f"<call>get_weather<sep>{WRITTEN}<end>"


@pytest.mark.parametrize("text", ['{"city": "Par', "[1, 2]", '"Paris"', "", "null"])
def test_arguments_that_are_not_an_object_stay_text(text: str) -> None:
    """Broken JSON or a non-object value is replayed as the text given."""
    assert template_arguments(text) == text and isinstance(template_arguments(text), str)


def test_arguments_nested_past_the_parser_limit_stay_text() -> None:
    """JSON nested deeper than the parser recurses is kept as text, not an error."""
    deep = '{"a": ' * 100_000 + "1" + "}" * 100_000
    assert template_arguments(deep) == deep


def test_template_arguments_is_the_parsed_object() -> None:
    value = template_arguments(WRITTEN)
    assert isinstance(value, TemplateArguments)
    assert value == {"city": "Paris", "days": 2} and str(value) == WRITTEN


def test_an_argument_named_text_reads_as_that_argument(tiny_files: dict[str, bytes]) -> None:
    """`arguments.text` in a template is the argument `text`, not the JSON kept aside."""
    template = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments.text }}{% endfor %}{% endfor %}"  # noqa: E501
    assert _render(tiny_files, template, '{"text": "hello"}') == "hello"
