"""Simulated log probabilities (`homing.sim.logprobs`): a pure function of key, position and
token, shaped as SGLang sends them: logprobs <= 0, top entries descending and distinct, the
greedy token first."""

from __future__ import annotations

import itertools
import math

import pytest

from homing.sim.logprobs import (
    input_logprobs,
    output_logprobs,
    position_logprobs,
    prefill_only_logprobs,
)

POOL = tuple(range(500, 600))


@pytest.mark.parametrize("greedy", [True, False])
def test_position_logprobs_are_deterministic(greedy: bool) -> None:
    a = position_logprobs(42, 3, 517, 5, greedy, POOL)
    assert a == position_logprobs(42, 3, 517, 5, greedy, POOL)
    assert a != position_logprobs(43, 3, 517, 5, greedy, POOL)


def test_the_greedy_token_is_the_top_1() -> None:
    for position in range(50):
        value, ids, values = position_logprobs(7, position, 550, 4, True, POOL)
        assert ids[0] == 550 and values[0] == value


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("top_n", [0, 1, 5, 20])
def test_top_entries_fall_strictly_are_distinct_and_below_zero(greedy: bool, top_n: int) -> None:
    for position in range(40):
        value, ids, values = position_logprobs(11, position, 520, top_n, greedy, POOL)
        assert value < 0
        assert len(ids) == len(values) == top_n
        assert len(set(ids)) == top_n
        assert all(a > b for a, b in itertools.pairwise(values))
        assert all(v < 0 for v in values)
        assert sum(math.exp(v) for v in values) < 1
        if 520 in ids:
            assert values[ids.index(520)] == value


def test_a_sampled_token_is_sometimes_not_the_top_1() -> None:
    ranks = [position_logprobs(9, p, 530, 20, False, POOL)[1].index(530) for p in range(200)]
    assert 0 in ranks and any(r > 0 for r in ranks)


def test_output_logprobs_cover_each_token_at_its_position() -> None:
    tokens = [501, 502, 503, 504]
    whole = output_logprobs(5, 0, tokens, 3, True, POOL)
    assert list(whole.token_ids) == tokens
    assert len(whole.token_logprobs) == 4 and len(whole.top_logprobs) == 4
    tail = output_logprobs(5, 2, tokens[2:], 3, True, POOL)
    assert list(tail.token_logprobs) == list(whole.token_logprobs)[2:]
    assert not output_logprobs(5, 0, tokens, 0, True, POOL).top_logprobs


def test_prompt_logprobs_have_no_value_at_the_range_start_and_depend_on_the_prefix() -> None:
    prompt = [510, 511, 512, 513, 514]
    message = input_logprobs(prompt, 1, 2, POOL)
    assert list(message.token_ids) == prompt[1:]
    assert not message.token_logprobs[0].HasField("value")
    assert not message.top_logprobs[0].token_ids
    assert all(entry.HasField("value") for entry in message.token_logprobs[1:])
    assert all(len(row.token_ids) == 2 for row in message.top_logprobs[1:])
    # a token's entry depends on the token before it and its position, not the rest
    other = input_logprobs([510, 511, 512, 599, 514], 1, 2, POOL)
    assert other.token_logprobs[1] == message.token_logprobs[1]
    assert input_logprobs(prompt, 5, 2, POOL).token_ids == []


def test_a_prefill_only_request_gets_one_top_row_and_no_token() -> None:
    message = prefill_only_logprobs(3, 4, True, POOL)
    assert not message.token_ids and len(message.top_logprobs) == 1
    assert len(message.top_logprobs[0].token_ids) == 4
    assert not prefill_only_logprobs(3, 0, True, POOL).top_logprobs
