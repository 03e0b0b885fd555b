"""The stop-caps bench's own copy of the request caps cannot drift from the gateway's."""

from __future__ import annotations

from homing.bench import stop_caps
from homing.gateway import requests


def test_the_bench_caps_equal_the_gateways_validation_limits() -> None:
    """n, the number of stop strings and their length: the bench loads exactly the caps the
    gateway enforces (16, 4 and 1,024, as README.md documents them)."""
    assert (stop_caps.MAX_N, stop_caps.MAX_STOP_SEQUENCES, stop_caps.MAX_STOP_LENGTH) == (
        requests.MAX_N,
        requests.MAX_STOP_SEQUENCES,
        requests.MAX_STOP_LENGTH,
    )


def test_cap_stops_builds_the_most_stops_of_the_longest_length_allowed() -> None:
    """For an answer longer than a stop, every request gets MAX_STOP_SEQUENCES distinct stops of
    exactly MAX_STOP_LENGTH characters, none of which occurs in the answer."""
    answer = "".join(f"word{i} " for i in range(400))
    stops = stop_caps.cap_stops(answer, 3)
    assert len(stops) == requests.MAX_STOP_SEQUENCES
    assert {len(stop) for stop in stops} == {requests.MAX_STOP_LENGTH}
    assert len(set(stops)) == len(stops)
    assert not any(stop in answer for stop in stops)
