"""Health judged by progress: which load records show engine work, and when a probe
timeout on a busy worker counts."""

from __future__ import annotations

import pytest

from homing.engines.health import (
    LoadSample,
    ProbeOutcome,
    is_busy,
    probe_verdict,
    shows_progress,
    stalled,
)

BUSY = LoadSample(running=4, waiting=2, token_usage=0.30, waiting_uncached_tokens=800,
                  prefill_pending_tokens=900)  # fmt: skip


def changed(**fields: float) -> LoadSample:
    return LoadSample(**{**BUSY.__dict__, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("after", "progress"),
    [
        (changed(token_usage=0.31), True),  # decode wrote KV
        (changed(running=5, waiting=1), True),  # admitted from the queue
        (changed(running=3), True),  # one finished
        (changed(waiting=1), True),
        (changed(prefill_pending_tokens=500), True),  # a chunk of prefill done
        (changed(waiting_uncached_tokens=100), True),
        (changed(waiting=3), False),  # only an arrival: a wedged engine still queues
        (changed(waiting=3, waiting_uncached_tokens=1000, prefill_pending_tokens=1100), False),
        (BUSY, False),  # a heartbeat repeating the same figures
    ],
)
def test_which_load_records_show_engine_work(after: LoadSample, progress: bool) -> None:
    assert shows_progress(BUSY, after) is progress


def test_a_first_record_shows_no_progress() -> None:
    assert not shows_progress(None, BUSY)


def test_busy_means_our_requests_or_the_engines() -> None:
    idle = LoadSample(running=0, waiting=0, token_usage=0.0)
    assert is_busy(1, idle) and is_busy(0, BUSY) and is_busy(1, None)
    assert not is_busy(0, idle) and not is_busy(0, None)


def verdict(outcome: ProbeOutcome, busy: bool, last: float | None, now: float = 100.0) -> object:
    return probe_verdict(outcome, busy=busy, last_progress_at=last, now=now, window_s=5.0)


def test_a_timeout_on_a_busy_progressing_worker_counts_neither_way() -> None:
    assert verdict(ProbeOutcome.TIMED_OUT, busy=True, last=96.0) is None
    assert verdict(ProbeOutcome.TIMED_OUT, busy=True, last=95.0) is None  # at the window's edge


def test_a_timeout_counts_when_progress_stopped_or_never_came_or_the_worker_idles() -> None:
    assert verdict(ProbeOutcome.TIMED_OUT, busy=True, last=94.9) is False
    assert verdict(ProbeOutcome.TIMED_OUT, busy=True, last=None) is False
    assert verdict(ProbeOutcome.TIMED_OUT, busy=False, last=99.0) is False


def test_an_answer_counts_whatever_the_progress() -> None:
    """Answered unhealthy (or unreachable) is a failure even mid-work; healthy a success."""
    assert verdict(ProbeOutcome.FAILED, busy=True, last=99.9) is False
    assert verdict(ProbeOutcome.OK, busy=False, last=None) is True


def test_a_timeout_with_streams_open_and_progress_older_than_the_window_proves_a_stall() -> None:
    def judge(outcome: ProbeOutcome, streams: int, last: float | None) -> bool:
        return stalled(outcome, open_streams=streams, last_progress_at=last, now=10.0, window_s=5.0)

    assert judge(ProbeOutcome.TIMED_OUT, 1, 4.9)
    assert not judge(ProbeOutcome.TIMED_OUT, 1, 5.0)  # progress within the window
    assert not judge(ProbeOutcome.TIMED_OUT, 0, 0.0)  # nothing that should progress
    assert not judge(ProbeOutcome.TIMED_OUT, 1, None)  # progress never known
    assert not judge(ProbeOutcome.FAILED, 1, 0.0)  # an answer, even "unhealthy", is no stall
