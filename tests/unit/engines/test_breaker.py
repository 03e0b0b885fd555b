"""The per-worker circuit breaker as a pure state machine on a virtual clock."""

from __future__ import annotations

import pytest

from homing.engines import breaker as brk
from homing.engines.breaker import Breaker, BreakerConfig, BreakerState

CFG = BreakerConfig(consecutive=5, open_s=1.0, max_open_s=30.0)


def failures(b: Breaker, n: int, now: float = 0.0) -> Breaker:
    for _ in range(n):
        b = brk.on_failure(b, now, CFG)
    return b


def test_five_consecutive_transport_failures_open_it() -> None:
    """Four leave it closed (and admitting); the fifth opens it for 1 s."""
    b = failures(Breaker(), 4)
    assert (b.state, b.failures, b.admits) == (BreakerState.CLOSED, 4, True)
    b = brk.on_failure(b, 10.0, CFG)
    assert (b.state, b.admits, b.open_until, b.opens) == (BreakerState.OPEN, False, 11.0, 1)


def test_a_success_resets_the_failure_run() -> None:
    """Failures broken by a success never reach five."""
    b = failures(brk.on_success(failures(Breaker(), 4), trial=False), 4)
    assert b.state is BreakerState.CLOSED


def test_failures_after_the_success_still_count() -> None:
    """A success learnt after three of four failures came keeps those three: the fifth
    failure in all opens it."""
    b = brk.on_success(failures(Breaker(), 4), trial=False, failures_after=3)
    assert b.failures == 3
    assert failures(b, 2).state is BreakerState.OPEN


def test_it_turns_half_open_only_when_its_interval_has_passed() -> None:
    b = failures(Breaker(), 5, now=0.0)
    assert brk.tick(b, 0.999).state is BreakerState.OPEN
    half = brk.tick(b, 1.0)
    assert (half.state, half.admits) == (BreakerState.HALF_OPEN, True)


def test_half_open_lets_exactly_one_trial_through() -> None:
    """The first request takes the trial slot; no second one is admitted."""
    half = brk.tick(failures(Breaker(), 5), 1.0)
    after, trial = brk.start_request(half)
    assert trial and not after.admits
    with pytest.raises(ValueError):
        brk.start_request(after)


def test_the_trials_success_closes_it_and_resets_the_backoff() -> None:
    half = brk.tick(failures(Breaker(), 5), 1.0)
    after, _ = brk.start_request(half)
    closed = brk.on_success(after, trial=True)
    assert closed == Breaker()
    assert failures(closed, 5, now=100.0).open_until == 101.0  # 1 s again


def test_a_trial_ended_with_no_outcome_frees_the_slot_and_changes_nothing_else() -> None:
    """`end_trial`: half-open again with the slot free (the next request is the trial);
    no effect on a closed or open breaker, nor on a half-open one whose slot is free."""
    half = brk.tick(failures(Breaker(), 5), 1.0)
    after, _ = brk.start_request(half)
    freed = brk.end_trial(after)
    assert freed == half and freed.admits
    assert brk.start_request(freed)[1]
    for b in (Breaker(), failures(Breaker(), 5), half):
        assert brk.end_trial(b) == b


def test_a_failed_trial_reopens_with_the_interval_doubled_up_to_the_cap() -> None:
    """1, 2, 4, 8, 16, 30, 30 s."""
    b = failures(Breaker(), 5, now=0.0)
    intervals = [b.open_until]
    now = 0.0
    for _ in range(6):
        now = b.open_until
        b, trial = brk.start_request(brk.tick(b, now))
        assert trial
        b = brk.on_failure(b, now, CFG)
        intervals.append(b.open_until - now)
    assert intervals == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_failures_while_open_do_not_extend_it() -> None:
    """Requests sent before it opened may still fail: the interval stays."""
    b = failures(Breaker(), 5, now=0.0)
    assert brk.on_failure(b, 0.5, CFG) == b


def test_in_half_open_only_the_trial_success_counts() -> None:
    """A request from before the open that ends well does not close it; any failure
    re-opens it."""
    half = brk.tick(failures(Breaker(), 5), 1.0)
    taken, _ = brk.start_request(half)
    assert brk.on_success(taken, trial=False) == taken
    assert brk.on_failure(taken, 1.5, CFG).state is BreakerState.OPEN


def test_a_disabled_breaker_never_opens() -> None:
    off = BreakerConfig(enabled=False)
    b = Breaker()
    for _ in range(50):
        b = brk.on_failure(b, 0.0, off)
    assert b.state is BreakerState.CLOSED and b.admits


@pytest.mark.parametrize("bad", [{"consecutive": 0}, {"open_s": 0.0}, {"open_s": 40.0}])
def test_a_config_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(**bad)  # type: ignore[arg-type]
