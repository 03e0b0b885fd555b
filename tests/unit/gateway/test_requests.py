"""Request validation is pure: bodies become typed requests or 400s naming the parameter."""

from __future__ import annotations

import pytest

from homing.gateway.errors import APIError
from homing.gateway.requests import parse_chat, parse_completion

MSG = [{"role": "user", "content": "hi"}]


def test_content_parts_are_joined() -> None:
    """A message's list of text parts is one string."""
    req = parse_chat(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
        }
    )
    assert req.messages[0].text() == "ab"


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    """The newer `max_completion_tokens` takes precedence."""
    req = parse_chat({"model": "m", "messages": MSG, "max_tokens": 5, "max_completion_tokens": 9})
    assert req.max_new_tokens == 9


def test_completion_default_max_tokens_is_16() -> None:
    """Legacy completions default to 16 new tokens, as OpenAI's API does."""
    assert parse_completion({"model": "m", "prompt": "x"}).max_new_tokens == 16


def test_stop_accepts_string_or_list_of_at_most_four() -> None:
    """`stop` may be one string or up to 4 non-empty strings."""
    assert parse_chat({"model": "m", "messages": MSG, "stop": "x"}).stop_strings == ["x"]
    with pytest.raises(APIError) as info:
        parse_chat({"model": "m", "messages": MSG, "stop": ["a", "b", "c", "d", "e"]})
    assert info.value.param == "stop"
    with pytest.raises(APIError):
        parse_chat({"model": "m", "messages": MSG, "stop": [""]})


@pytest.mark.parametrize("prompt", [[], [1, -2], [True], {"a": 1}, None, 3])
def test_bad_prompts_are_400(prompt: object) -> None:
    """A prompt must be text or a non-empty list of non-negative token ids."""
    with pytest.raises(APIError) as info:
        parse_completion({"model": "m", "prompt": prompt})
    assert info.value.status == 400
    assert info.value.param == "prompt"


def test_unsupported_parameters_are_named() -> None:
    """Features the gateway does not serve are refused by name, not silently ignored."""
    with pytest.raises(APIError) as info:
        parse_chat({"model": "m", "messages": MSG, "tools": [{"type": "function"}]})
    assert (info.value.status, info.value.param, info.value.code) == (
        400,
        "tools",
        "unsupported_parameter",
    )


def test_booleans_are_not_integers() -> None:
    """`max_tokens: true` is not 1."""
    with pytest.raises(APIError) as info:
        parse_chat({"model": "m", "messages": MSG, "max_tokens": True})
    assert info.value.param == "max_tokens"
