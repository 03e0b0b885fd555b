"""The chaos suite's scenario summary (counts, fault timings, checks), its counter readings
and its scenario plans, on hand-made records."""

from __future__ import annotations

import pytest

from homing.bench.chaos.analysis import (
    CounterReading,
    FaultWindow,
    RequestRecord,
    count_retried_log_lines,
    counter_delta,
    healthy_workers,
    migration_counter,
    retry_counter,
    stop_and_back,
    summarize,
)
from homing.bench.chaos.outcome import Outcome
from homing.bench.chaos.scenarios import FaultPlan, flap_schedule, phases, plan

WORKERS = ["w0", "w1", "w2"]


def _rec(
    start: float, worker: str | None, outcome: Outcome = Outcome.COMPLETED, status: int = 200
) -> RequestRecord:
    return RequestRecord(
        client=0,
        start_s=start,
        end_s=start + 0.3,
        status=status,
        worker=worker,
        first_content_s=None if outcome is not Outcome.COMPLETED else start + 0.05,
        outcome=outcome,
        reason="ok" if outcome is Outcome.COMPLETED else "why",
    )


KILL = FaultWindow("kill", "w0", 2.0, 6.0)


def test_a_worker_is_healthy_when_no_fault_is_in_force_on_it() -> None:
    """Fault windows are half-open: in force from start, gone at end."""
    assert healthy_workers(WORKERS, [KILL], 1.9) == WORKERS
    assert healthy_workers(WORKERS, [KILL], 2.0) == ["w1", "w2"]
    assert healthy_workers(WORKERS, [KILL], 6.0) == WORKERS
    never = FaultWindow("kill", "w1", 2.0, None)
    assert healthy_workers(WORKERS, [KILL, never], 100.0) == ["w0", "w2"]


def test_stopped_and_back_come_from_the_served_worker_header() -> None:
    """Last request it served that started in the fault (2.5 - 2.0), first after it."""
    records = [_rec(1.0, "w0"), _rec(2.5, "w0"), _rec(3.0, "w1"), _rec(7.25, "w0")]
    assert stop_and_back(KILL, records) == (0.5, True, 1.25)


def test_a_worker_still_served_in_the_last_quarter_never_stopped() -> None:
    """Served at 5.5 of a 2-6 window (last quarter from 5.0): the router kept sending."""
    records = [_rec(1.0, "w0"), _rec(5.5, "w0"), _rec(6.5, "w0")]
    assert stop_and_back(KILL, records) == (3.5, False, 0.5)


def test_stop_and_back_do_not_apply_to_a_worker_that_served_nothing_before() -> None:
    """No baseline traffic on the worker: both figures are not applicable."""
    assert stop_and_back(KILL, [_rec(3.0, "w1"), _rec(7.0, "w0")]) == (None, None, None)


def test_a_worker_that_never_came_back_has_no_back_time() -> None:
    """Served before, nothing after the fault ended: back is None and the check fails."""
    records = [_rec(1.0, "w0"), _rec(7.0, "w1")]
    assert stop_and_back(KILL, records) == (0.0, True, None)
    summary = summarize("kill", records, [KILL], WORKERS)
    assert summary["checks"]["recovered"] is False
    assert summary["ok"] is False


def test_failures_before_the_first_byte_with_a_healthy_other_break_the_check() -> None:
    """A 503 at 3.0 while w1 and w2 had no fault counts; the summary says who was healthy
    and what the gateway reported."""
    records = [_rec(1.0, "w0"), _rec(3.0, None, Outcome.FAILED_BEFORE_FIRST_BYTE, 503)]
    records.append(_rec(6.5, "w0"))
    health = [(0.0, {"w0": True, "w1": True, "w2": True}), (2.5, {"w0": False, "w1": True})]
    summary = summarize("kill", records, [KILL], WORKERS, health_samples=health)
    assert (summary["failed_before_first_byte"], summary["sent"]) == (1, 3)
    assert summary["failed_before_first_byte_with_healthy_other"] == 1
    assert summary["failures_before_first_byte"] == [
        {
            "start_s": 3.0,
            "reason": "why",
            "healthy_workers": ["w1", "w2"],
            "gateway_healthy_workers": ["w1"],
        }
    ]
    assert summary["checks"]["no_failure_before_first_byte_with_healthy_other"] is False


def test_a_failure_with_no_healthy_worker_left_does_not_break_the_check() -> None:
    """With one worker, killed, a 503 is the honest answer."""
    records = [_rec(1.0, "w0"), _rec(3.0, None, Outcome.FAILED_BEFORE_FIRST_BYTE, 503)]
    records.append(_rec(6.5, "w0"))
    summary = summarize("kill", records, [KILL], ["w0"])
    assert summary["failed_before_first_byte"] == 1
    assert summary["failed_before_first_byte_with_healthy_other"] == 0
    assert summary["ok"] is True


@pytest.mark.parametrize(
    ("outcome", "check"), [(Outcome.HUNG, "no_hung"), (Outcome.CUT, "errors_explicit")]
)
def test_a_hung_or_silently_cut_request_fails_its_check(outcome: Outcome, check: str) -> None:
    """One such request fails the scenario; a failure mid-stream with an error event does not."""
    records = [_rec(1.0, "w0"), _rec(3.0, "w1", outcome), _rec(6.5, "w0")]
    records.append(_rec(3.0, "w0", Outcome.FAILED_MID_STREAM))
    summary = summarize("kill", records, [KILL], WORKERS)
    failed = [name for name, ok in summary["checks"].items() if not ok]
    assert failed == [check]
    assert summary["failed_mid_stream"] == 1
    assert summary["failure_samples"][outcome.value][0]["worker"] == "w1"


def test_no_completed_request_or_an_unsettled_start_fails() -> None:
    """A scenario where nothing completed, or that began with a worker unhealthy, fails."""
    summary = summarize("kill", [], [], WORKERS, settled=False)
    assert summary["checks"]["served"] is False and summary["checks"]["settled"] is False


def test_the_retry_counter_counts_only_its_retried_outcome() -> None:
    """`homing_retries_total{outcome}`: done = "retried"; the rest are kept by outcome."""
    before = [
        ("homing_retries_total", {"model": "m", "outcome": "retried"}, 2.0),
        ("homing_retries_total", {"model": "m", "outcome": "budget_exhausted"}, 0.0),
        ("homing_requests_total", {"model": "m"}, 100.0),
    ]
    after = [
        ("homing_retries_total", {"model": "m", "outcome": "retried"}, 7.0),
        ("homing_retries_total", {"model": "m", "outcome": "budget_exhausted"}, 1.0),
    ]
    a, b = retry_counter(before), retry_counter(after)
    assert a == CounterReading("homing_retries_total", {"retried": 2.0, "budget_exhausted": 0.0})
    assert counter_delta(a, b) == (5, {"budget_exhausted": 1, "retried": 5})


def test_a_retry_counter_of_another_name_is_found_but_not_a_budget_one() -> None:
    """Any `homing_*retr*_total` counts, except one that names refused retries."""
    samples = [
        ("homing_retry_budget_exhausted_total", {}, 9.0),
        ("homing_gateway_retries_total", {"model": "m"}, 3.0),
    ]
    reading = retry_counter(samples)
    assert reading is not None and (reading.name, reading.done()) == (
        "homing_gateway_retries_total",
        3.0,
    )
    assert retry_counter([("homing_retry_budget_exhausted_total", {}, 9.0)]) is None
    assert counter_delta(None, reading) is None


def test_the_migration_counter_counts_migrated_streams() -> None:
    """`homing_stream_migrations_total{outcome="migrated"}` is the done count."""
    reading = migration_counter(
        [
            ("homing_stream_migrations_total", {"outcome": "migrated"}, 4.0),
            ("homing_stream_migrations_total", {"outcome": "no_other_worker"}, 1.0),
        ]
    )
    assert reading is not None and reading.done() == 4.0
    assert migration_counter([]) is None


def test_retried_log_lines_are_counted_by_their_event() -> None:
    """Only JSON lines whose event is request_retried count."""
    lines = [
        '{"request_id": "a", "worker": "w0", "event": "request_retried", "level": "info"}',
        '{"event": "request_done", "outcome": "ok", "note": "request_retried"}',
        "request_retried but not JSON",
        '{"event": "request_retried"}',
    ]
    assert count_retried_log_lines(lines) == 2


def test_mixed_leaves_the_last_worker_without_a_fault() -> None:
    """Three workers: kill and reject on w0 and w1; one worker: a kill alone."""
    assert plan("mixed", 3) == [FaultPlan("kill", 0), FaultPlan("reject", 1)]
    assert plan("mixed", 1) == [FaultPlan("kill", 0)]
    assert plan("stall", 3) == [FaultPlan("stall", 0)]
    with pytest.raises(ValueError, match="unknown scenario"):
        plan("meteor", 3)


def test_flapping_starts_unhealthy_and_ends_healthy() -> None:
    """Flips every period from unhealthy, and healthy at the fault's end."""
    assert flap_schedule(5.0, 2.0) == [(0.0, False), (2.0, True), (4.0, False), (5.0, True)]


def test_phases_split_the_duration() -> None:
    """15% before, 35% under the fault, the rest after."""
    ph = phases(20.0)
    assert (ph.pre_s, ph.fault_s, ph.post_s, ph.total_s) == (3.0, 7.0, 10.0, 20.0)


def test_latency_of_completed_requests_is_summarized() -> None:
    """TTFT and total time come from completed requests only."""
    records = [_rec(1.0, "w0"), _rec(2.0, "w1"), _rec(3.0, "w1", Outcome.FAILED_MID_STREAM)]
    latency = summarize("stall", records, [], WORKERS)["completed_latency_s"]
    assert latency == {
        "ttft": {"p50": 0.05, "p99": 0.05, "max": 0.05},
        "total": {"p50": 0.3, "p99": 0.3, "max": 0.3},
    }
    assert summarize("stall", [], [], WORKERS)["completed_latency_s"]["ttft"]["max"] is None
