"""SLO verdicts, goodput and multiwindow burn-rate alerts on a virtual clock."""

from __future__ import annotations

import pytest

from homing.clock import ManualClock
from homing.obs.slo import Slo, SloTracker, judge
from homing.obs.window import WindowedSums


def test_a_completed_request_meets_the_slo_only_within_both_limits() -> None:
    slo = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05)
    assert judge(slo, "ok", None, 0.5, 0.05) == "met"
    assert judge(slo, "ok", None, 0.501, 0.01) == "missed"
    assert judge(slo, "ok", None, 0.1, 0.051) == "missed"
    assert judge(slo, "ok", None, 0.1, None) == "met"  # one token: TTFT alone
    assert judge(slo, "ok", None, None, None) == "missed"  # no time known at all


def test_a_whole_answer_is_judged_on_its_end_to_end_time_for_its_tokens() -> None:
    """Its engine sent it whole (no TTFT, no TPOT): 61 tokens may take 0.5 + 60 x 0.05 s."""
    slo = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05)
    assert judge(slo, "ok", None, None, None, e2e_s=3.5, tokens_per_choice=61) == "met"
    assert judge(slo, "ok", None, None, None, e2e_s=3.51, tokens_per_choice=61) == "missed"
    assert judge(slo, "ok", None, None, None, e2e_s=0.4, tokens_per_choice=1) == "met"


def test_a_client_that_gave_up_after_the_rule_was_broken_counts_as_missed() -> None:
    slo = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05)
    assert judge(slo, "client_closed", None, None, None, e2e_s=0.6) == "missed"  # no token
    assert judge(slo, "client_closed", None, 0.7, None, e2e_s=0.8) == "missed"
    assert judge(slo, "client_closed", None, 0.1, 0.2, e2e_s=2.0) == "missed"
    assert judge(slo, "client_closed", None, 0.1, 0.01, e2e_s=2.0) is None  # in time
    assert judge(slo, "client_closed", None, None, None, e2e_s=0.2) is None
    # a whole answer's allowance is unknown until its length is: no verdict
    assert judge(slo, "client_closed", None, None, None, e2e_s=9.0, streamed=False) is None


def test_the_per_request_rule_may_differ_from_the_p95_targets() -> None:
    slo = Slo(ttft_p95_s=0.5, tpot_p95_s=0.05, ttft_s=2.0, tpot_s=0.1)
    assert judge(slo, "ok", None, 1.5, 0.08) == "met"
    assert judge(slo, "ok", None, 2.5, 0.08) == "missed"


def test_service_failures_count_against_the_slo_and_client_doings_do_not() -> None:
    slo = Slo()
    for outcome in ("engine_error", "timeout", "drained", "worker_drained", "worker_removed",
                    "error"):  # fmt: skip
        assert judge(slo, outcome, None, None, None) == "failed"
    assert judge(slo, "error_503", 503, None, None) == "failed"  # no replica
    assert judge(slo, "error_429", 429, None, None) is None  # the tenant's quota
    assert judge(slo, "error_400", 400, None, None) is None
    assert judge(slo, "client_closed", None, 0.1, None) is None


def test_windowed_sums_drop_what_falls_out_of_the_window() -> None:
    clock = ManualClock(1000.0)
    sums = WindowedSums(("a",), now=clock.now, horizon_s=60.0, resolution_s=5.0)
    sums.add((1,))
    clock.advance(30.0)
    sums.add((2,))
    assert sums.sums(60.0) == {"a": 3.0}
    assert sums.sums(10.0) == {"a": 2.0}
    clock.advance(35.0)  # the first value is 65 s old
    assert sums.sums(60.0) == {"a": 2.0}
    clock.advance(100.0)
    assert sums.sums(60.0) == {"a": 0.0}
    with pytest.raises(ValueError):
        WindowedSums(("a",), now=clock.now, horizon_s=1.0, resolution_s=5.0)


def test_one_pass_over_several_windows_gives_each_windows_sums() -> None:
    clock = ManualClock()
    sums = WindowedSums(("a", "b"), now=clock.now, horizon_s=3600.0, resolution_s=5.0)
    for i in range(3000):
        sums.add((1, i))
        clock.advance(1.0)
    windows = [60.0, 300.0, 1800.0, 3600.0, 10.0]
    assert sums.sums_many(windows) == {w: sums.sums(w) for w in windows}


def test_zero_traffic_gives_no_burn_full_attainment_and_zero_goodput() -> None:
    clock = ManualClock()
    status = SloTracker(Slo(), now=clock.now).status()
    assert status.burn_rates == {"5m": 0.0, "30m": 0.0, "1h": 0.0, "6h": 0.0}
    assert status.alerts == {"page": False, "ticket": False}
    assert status.attainment == 1.0
    assert status.goodput_rps == 0.0 and status.goodput_tps == 0.0


def _steady(tracker: SloTracker, clock: ManualClock, seconds: int, bad_every: int) -> None:
    """One request a second for `seconds`; every `bad_every`-th misses (0: none do)."""
    for i in range(seconds):
        bad = bad_every and i % bad_every == 0
        tracker.record("missed" if bad else "met", 10)
        clock.advance(1.0)


def test_goodput_and_attainment_are_the_met_requests_and_their_tokens() -> None:
    clock = ManualClock()
    tracker = SloTracker(Slo(objective=0.95), now=clock.now)
    _steady(tracker, clock, 300, bad_every=4)  # 75 of 300 missed
    status = tracker.status()
    assert status.attainment == pytest.approx(225 / 300, abs=0.02)
    # the last 60 s: 45 of 60 met, 10 tokens each
    assert status.goodput_rps == pytest.approx(45 / 60, abs=0.05)
    assert status.goodput_tps == pytest.approx(450 / 60, abs=0.5)
    # 25% bad over a 5% budget: burn rate 5
    assert status.burn_rates["5m"] == pytest.approx(5.0, rel=0.05)


def test_the_page_fires_only_when_the_hour_and_the_five_minutes_both_burn_fast() -> None:
    clock = ManualClock()
    tracker = SloTracker(Slo(objective=0.99), now=clock.now)  # budget 1%
    _steady(tracker, clock, 3600, bad_every=0)  # a clean hour
    _steady(tracker, clock, 300, bad_every=4)  # 25% bad for 5 minutes: burn 25 over 5m
    status = tracker.status()
    assert status.burn_rates["5m"] > 14.4
    assert status.burn_rates["1h"] < 14.4  # a short spike: no page yet
    assert status.alerts["page"] is False
    _steady(tracker, clock, 2400, bad_every=4)  # 45 of the last 60 minutes bad
    status = tracker.status()
    assert status.burn_rates["1h"] > 14.4 and status.burn_rates["5m"] > 14.4
    assert status.alerts["page"] is True
    _steady(tracker, clock, 600, bad_every=0)  # recovered: the 5-minute window clears
    status = tracker.status()
    assert status.burn_rates["5m"] == 0.0
    assert status.burn_rates["1h"] > 14.4
    assert status.alerts["page"] is False  # the short window resets the page


def test_the_ticket_fires_when_six_hours_and_thirty_minutes_burn_over_six() -> None:
    clock = ManualClock()
    tracker = SloTracker(Slo(objective=0.99), now=clock.now)
    _steady(tracker, clock, 6 * 3600, bad_every=12)  # 8.3% bad: burn 8.3
    status = tracker.status()
    assert status.burn_rates["6h"] == pytest.approx(100 / 12, rel=0.05)
    assert status.alerts["ticket"] is True
    assert status.alerts["page"] is False  # 8.3 < 14.4
    _steady(tracker, clock, 1800, bad_every=0)
    status = tracker.status()
    assert status.burn_rates["30m"] == 0.0
    assert status.alerts["ticket"] is False
