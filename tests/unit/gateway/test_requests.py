"""Request validation is pure: bodies become typed requests or 400s naming the parameter."""

from __future__ import annotations

import json

import pytest

from homing.gateway.errors import APIError
from homing.gateway.requests import JSON_OBJECT_SCHEMA, parse_chat, parse_completion

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


@pytest.mark.parametrize(
    "prompt", [[], [1, -2], [True], [1, False], [1, 2.0], [1, "2"], [[1]], {"a": 1}, None, 3]
)
def test_bad_prompts_are_400(prompt: object) -> None:
    """A prompt must be text or a non-empty list of non-negative token ids."""
    with pytest.raises(APIError) as info:
        parse_completion({"model": "m", "prompt": prompt})
    assert info.value.status == 400
    assert info.value.param == "prompt"


def test_unsupported_parameters_are_named() -> None:
    """Features the gateway does not serve are refused by name, not silently ignored."""
    with pytest.raises(APIError) as info:
        parse_chat({"model": "m", "messages": MSG, "audio": {"voice": "alloy"}})
    assert (info.value.status, info.value.param, info.value.code) == (
        400,
        "audio",
        "unsupported_parameter",
    )


def test_booleans_are_not_integers() -> None:
    """`max_tokens: true` is not 1."""
    with pytest.raises(APIError) as info:
        parse_chat({"model": "m", "messages": MSG, "max_tokens": True})
    assert info.value.param == "max_tokens"


# OpenAI's API reference, chat completions and (legacy) completions request bodies.
OPENAI_CHAT = (
    "messages model audio frequency_penalty function_call functions logit_bias logprobs "
    "max_completion_tokens max_tokens metadata modalities n parallel_tool_calls prediction "
    "presence_penalty prompt_cache_key reasoning_effort response_format safety_identifier seed "
    "service_tier stop store stream stream_options temperature tool_choice tools top_logprobs "
    "top_p user verbosity web_search_options"
).split()
OPENAI_COMPLETIONS = (
    "model prompt best_of echo frequency_penalty logit_bias logprobs max_tokens n "
    "presence_penalty seed stop stream stream_options suffix temperature top_p user"
).split()
PROBE = [object()]  # a value no parameter takes as "off", nor as valid


def _code(parse: object, body: dict[str, object]) -> str | None:
    try:
        parse(body)  # type: ignore[operator]
    except APIError as err:
        return err.code
    return None


@pytest.mark.parametrize("name", OPENAI_CHAT)
def test_every_openai_chat_parameter_is_known(name: str) -> None:
    """Each OpenAI chat parameter is served or refused by name, never taken for a typo."""
    body = {"model": "m", "messages": MSG, name: PROBE}
    assert _code(parse_chat, body) in ("invalid_value", "unsupported_parameter")


@pytest.mark.parametrize("name", OPENAI_COMPLETIONS)
def test_every_openai_completions_parameter_is_known(name: str) -> None:
    """Each OpenAI completions parameter is served or refused by name, never taken for a typo."""
    body = {"model": "m", "prompt": "x", name: PROBE}
    assert _code(parse_completion, body) in ("invalid_value", "unsupported_parameter")


def test_unknown_parameter_is_refused_like_openai() -> None:
    """A name no endpoint knows is 400 `unknown_parameter`, with OpenAI's message."""
    with pytest.raises(APIError) as info:
        parse_chat({"model": "m", "messages": MSG, "max_token": 5})
    assert (info.value.status, info.value.param, info.value.code, info.value.message) == (
        400,
        "max_token",
        "unknown_parameter",
        "Unrecognized request argument supplied: max_token",
    )


def test_off_values_compare_by_type() -> None:
    """`top_logprobs: 0` is off, `top_logprobs: false` is not the integer 0."""
    assert _code(parse_chat, {"model": "m", "messages": MSG, "top_logprobs": 0}) is None
    assert _code(parse_chat, {"model": "m", "messages": MSG, "top_logprobs": False}) == (
        "invalid_value"
    )
    assert _code(parse_completion, {"model": "m", "prompt": "x", "logprobs": True}) == (
        "invalid_value"
    )
    assert _code(parse_completion, {"model": "m", "prompt": "x", "echo": 1}) == "invalid_value"


def test_null_optional_parameters_take_their_defaults() -> None:
    """null means the default for an optional parameter, and stays an error for a required one."""
    req = parse_chat({"model": "m", "messages": MSG, "temperature": None, "n": None})
    assert (req.temperature, req.n) == (1.0, 1)
    assert _code(parse_chat, {"model": "m", "messages": None}) == "invalid_value"


def test_session_key_is_prompt_cache_key_then_user() -> None:
    """`prompt_cache_key` keys the session before `user`; completions use `user`."""
    both = {"model": "m", "messages": MSG, "user": "u", "prompt_cache_key": "k"}
    assert parse_chat(both).session_key == "k"
    assert parse_chat({"model": "m", "messages": MSG, "user": "u"}).session_key == "u"
    assert parse_completion({"model": "m", "prompt": "x", "user": "u"}).session_key == "u"
    assert parse_chat({"model": "m", "messages": MSG}).session_key is None


def test_response_format_becomes_the_engine_constraint() -> None:
    """text: none; json_object: SGLang's generic object schema; json_schema: its schema."""

    def constraint(fmt: dict[str, object]) -> str | None:
        return parse_chat(
            {"model": "m", "messages": MSG, "response_format": fmt}
        ).json_schema_constraint

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert constraint({"type": "text"}) is None
    assert constraint({"type": "json_object"}) == JSON_OBJECT_SCHEMA
    named = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    assert json.loads(constraint(named) or "") == schema


def test_logit_bias_is_keyed_by_token_id() -> None:
    """Decimal id strings become int ids; the biases are kept as floats."""
    req = parse_completion({"model": "m", "prompt": "x", "logit_bias": {"7": -100, "12": 0.5}})
    assert req.logit_bias_ids == {7: -100.0, 12: 0.5}


def test_best_of_is_served_only_equal_to_n() -> None:
    """best_of == n changes nothing and is served; any other value is refused."""
    assert parse_completion({"model": "m", "prompt": "x", "best_of": 2, "n": 2}).n == 2
    assert _code(parse_completion, {"model": "m", "prompt": "x", "best_of": 2}) == (
        "unsupported_parameter"
    )
