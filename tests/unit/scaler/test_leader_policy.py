"""The pure parts of leader election: a leader's own reckoning of its lease (`Tenure`) and a
follower's judgement of someone else's (`Observed`)."""

from __future__ import annotations

import pytest

from homing.scaler.leader import Observed, Tenure


def test_a_tenure_runs_from_when_the_request_was_sent_for_one_lease() -> None:
    tenure = Tenure(lease_s=10.0)
    assert not tenure.held(0.0) and tenure.left_s(0.0) == 0.0
    tenure.granted(7, sent=100.0)
    assert tenure.token == 7
    assert tenure.held(109.999) and not tenure.held(110.0)
    assert tenure.left_s(104.0) == pytest.approx(6.0)


def test_a_renew_extends_the_tenure_and_an_older_reply_never_shortens_it() -> None:
    tenure = Tenure(lease_s=10.0)
    tenure.granted(1, sent=0.0)
    tenure.renewed(sent=5.0)
    assert tenure.held(14.9) and not tenure.held(15.0)
    tenure.renewed(sent=3.0)  # a slower reply to an earlier renew
    assert tenure.held(14.9)


def test_an_ended_tenure_has_no_token_and_nothing_left() -> None:
    tenure = Tenure(lease_s=1.0)
    tenure.granted(3, sent=0.0)
    tenure.ended()
    assert tenure.token is None and not tenure.held(0.5) and tenure.left_s(0.5) == 0.0


def test_a_tenure_needs_a_positive_lease() -> None:
    with pytest.raises(ValueError, match="lease_s"):
        Tenure(lease_s=0.0)


def test_a_followers_clock_starts_when_it_first_sees_a_version() -> None:
    seen = Observed.update(None, "v1", 15.0, now=100.0)
    again = Observed.update(seen, "v1", 15.0, now=110.0)
    assert again.since == 100.0
    assert not again.expired(114.9) and again.expired(115.0)
    assert again.left_s(110.0) == pytest.approx(5.0)


def test_a_renewed_version_restarts_the_followers_clock() -> None:
    seen = Observed.update(None, "v1", 15.0, now=100.0)
    renewed = Observed.update(seen, "v2", 15.0, now=112.0)
    assert renewed.since == 112.0
    assert not renewed.expired(126.0) and renewed.expired(127.0)
