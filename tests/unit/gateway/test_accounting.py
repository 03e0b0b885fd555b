"""A request's accounting: its attempts' records and its timing, on explicit times."""

from __future__ import annotations

import pytest

from homing.gateway.accounting import Attempt, Timeline, Usage, quota_tokens


def test_an_attempt_is_timed_from_its_own_start_and_per_choice() -> None:
    """An attempt's TTFT counts from its own start, its TPOT per choice after the first
    token, and its cached tokens never exceed its prompt."""
    attempt = Attempt(worker_id="w1", started_at=10.0, prompt_tokens=8, choices=2)
    attempt.note(2, 50, now=10.5)  # one token per choice
    attempt.note(0, 0, now=10.6)  # a message with no new token does not move the times
    attempt.note(4, 0, now=11.5)
    record = attempt.record(failed=False, timed=True)
    assert (record.ttft_s, record.tpot_s) == (0.5, pytest.approx(0.5))
    assert (record.completion_tokens, record.cached_tokens, record.failed) == (6, 8, False)


def test_an_untimed_attempt_has_no_times_and_a_failed_one_counts() -> None:
    """An engine that sent each answer whole gives no TTFT or TPOT; a failed attempt is the
    replica's error whatever the request did next."""
    attempt = Attempt(worker_id="w1", started_at=0.0, prompt_tokens=4, choices=1, failed=True)
    attempt.note(5, 0, now=1.0)
    record = attempt.record(failed=False, timed=False)
    assert (record.ttft_s, record.tpot_s, record.failed) == (None, None, True)


@pytest.mark.parametrize(
    ("streamed", "tokens", "choices", "ttft_ms", "tpot_ms"),
    [
        (True, 11, 1, 500.0, 100.0),
        (True, 22, 2, 500.0, 100.0),  # choice-summed tokens
        (True, 1, 1, 500.0, None),  # one token: no time per token
        (True, 3, 2, 500.0, None),  # 1.5 per choice
        (False, 11, 1, None, None),  # answers sent whole: no times
    ],
)
def test_ttft_counts_from_arrival_and_tpot_per_choice_after_the_first(
    streamed: bool, tokens: int, choices: int, ttft_ms: float | None, tpot_ms: float | None
) -> None:
    """TTFT from the request's arrival to the first token; TPOT over the tokens after the
    first of each choice."""
    timeline = Timeline(opened_at=1.0)
    timeline.routed(1.2)
    timeline.routed(1.4)  # the first routing counts (queue time)
    timeline.tokens_at(1.5)
    timeline.tokens_at(2.5)
    assert timeline.routed_at == 1.2
    assert timeline.ttft_ms(1.0, streamed=streamed) == ttft_ms
    assert timeline.tpot_ms(tokens, choices, streamed=streamed) == (
        None if tpot_ms is None else pytest.approx(tpot_ms)
    )


def test_a_restart_voids_the_token_times_but_not_the_routing() -> None:
    """A request routed again keeps its first routing time and times its tokens anew."""
    timeline = Timeline(opened_at=0.0)
    timeline.routed(0.1)
    timeline.tokens_at(0.2)
    timeline.restart()
    assert timeline.ttft_ms(0.0, streamed=True) is None
    timeline.tokens_at(0.9)
    assert (timeline.routed_at, timeline.ttft_ms(0.0, streamed=True)) == (0.1, 900.0)


def test_usage_totals_prompt_and_completion() -> None:
    assert Usage(prompt_tokens=3, completion_tokens=4, cached_tokens=2).total_tokens == 7


@pytest.mark.parametrize(("routed", "tokens"), [(True, 7), (False, 0)])
def test_a_quota_settles_at_what_the_engine_was_given_and_made_or_nothing(
    routed: bool, tokens: int
) -> None:
    """A routed request is charged prompt + completion tokens; one that never reached a
    worker is charged nothing (its reservation is refunded whole)."""
    usage = Usage(prompt_tokens=3, completion_tokens=4, cached_tokens=3)
    assert quota_tokens(usage, routed=routed) == tokens
