"""The sticky weighted version split: shares, minimal movement on a weight change, the
availability filter and the weight validation."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Collection

import pytest

from homing.config.rules import MAX_VERSIONS, MAX_WEIGHT, MIN_WEIGHT
from homing.router.versions import VersionSplit

N_KEYS = 100_000


def _keys(n: int = N_KEYS, seed: int = 7) -> list[int]:
    """`n` random uint64 routing keys, the same ones on every run."""
    rng = random.Random(seed)
    return [rng.getrandbits(64) for _ in range(n)]


KEYS = _keys()


def _assign(split: VersionSplit, available: Collection[str] | None = None) -> list[str | None]:
    return [split.choose(k, available) for k in KEYS]


def _shares(chosen: list[str | None]) -> dict[str | None, float]:
    counts = Counter(chosen)
    return {v: c / len(chosen) for v, c in counts.items()}


@pytest.mark.parametrize(
    "weights",
    [
        {"v1": 95.0, "v2": 5.0},
        {"v1": 50.0, "v2": 50.0},
        {"a": 60.0, "b": 30.0, "c": 10.0},
        {"a": 1.0, "b": 3.0},  # relative weights, not percent
    ],
)
def test_shares_of_keys_match_the_weights_within_one_point(weights: dict[str, float]) -> None:
    split = VersionSplit(weights)
    got = _shares(_assign(split))
    expected = split.shares()
    assert set(got) == set(weights)
    for version, share in expected.items():
        assert abs(got[version] - share) < 0.01, (version, got[version], share)


def test_shares_are_weight_over_total() -> None:
    assert VersionSplit({"a": 1.0, "b": 3.0, "c": 0.0}).shares() == {
        "a": 0.25,
        "b": 0.75,
        "c": 0.0,
    }


def test_95_5_to_75_25_moves_about_20_percent_all_from_baseline_to_canary() -> None:
    before = _assign(VersionSplit({"v1": 95.0, "v2": 5.0}))
    after = _assign(VersionSplit({"v1": 75.0, "v2": 25.0}))
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert abs(len(moved) / N_KEYS - 0.20) < 0.01
    assert set(moved) == {("v1", "v2")}  # none the other way


def test_lowering_a_weight_only_moves_keys_away_from_it() -> None:
    before = _assign(VersionSplit({"a": 50.0, "b": 30.0, "c": 20.0}))
    after = _assign(VersionSplit({"a": 20.0, "b": 30.0, "c": 20.0}))
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert moved  # a lost keys ...
    assert {b for b, _ in moved} == {"a"}  # ... and only a did
    assert {a for _, a in moved} == {"b", "c"}  # to both of the others


def test_with_three_versions_raising_one_only_moves_keys_to_it() -> None:
    before = _assign(VersionSplit({"a": 50.0, "b": 30.0, "c": 20.0}))
    after = _assign(VersionSplit({"a": 50.0, "b": 30.0, "c": 60.0}))
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert moved
    assert {a for _, a in moved} == {"c"}
    assert {b for b, _ in moved} == {"a", "b"}  # taken from both others


def test_choose_is_deterministic_and_ignores_insertion_order() -> None:
    forward = VersionSplit({"a": 10.0, "b": 20.0, "c": 70.0})
    backward = VersionSplit({"c": 70.0, "b": 20.0, "a": 10.0})
    keys = KEYS[:5_000]
    first = [forward.choose(k) for k in keys]
    assert [forward.choose(k) for k in keys] == first
    assert [backward.choose(k) for k in keys] == first
    # A fresh object with the same weights agrees too (no per-instance state).
    assert [VersionSplit({"b": 20.0, "a": 10.0, "c": 70.0}).choose(k) for k in keys] == first


def test_keys_above_64_bits_are_masked_to_their_uint64() -> None:
    split = VersionSplit({"a": 50.0, "b": 50.0})
    for key in KEYS[:1_000]:
        assert split.choose(key + 2**64) == split.choose(key)


def test_an_unavailable_version_is_skipped_and_its_keys_come_back() -> None:
    split = VersionSplit({"a": 50.0, "b": 30.0, "c": 20.0})
    everyone = _assign(split)
    without_b = _assign(split, available={"a", "c"})
    assert "b" not in without_b
    # Only b's keys moved, and they spread over the others.
    for full, partial in zip(everyone, without_b, strict=True):
        if full != "b":
            assert partial == full
    assert {p for f, p in zip(everyone, without_b, strict=True) if f == "b"} == {"a", "c"}
    # Available again: every key is back where it was.
    assert _assign(split, available={"a", "b", "c"}) == everyone
    assert _assign(split, available=["a", "b", "c", "not-a-version"]) == everyone


def test_none_when_no_weighted_version_is_available() -> None:
    split = VersionSplit({"a": 100.0, "z": 0.0})
    assert split.choose(KEYS[0], available=set()) is None
    assert split.choose(KEYS[0], available={"z"}) is None  # weight 0 does not count
    assert split.choose(KEYS[0], available={"other"}) is None


def test_a_version_of_weight_0_gets_no_keys() -> None:
    split = VersionSplit({"a": 1.0, "z": 0.0})
    chosen = _assign(split)
    assert set(chosen) == {"a"}
    assert split.shares()["z"] == 0.0


def test_equal_splits_compare_equal_by_weights() -> None:
    assert VersionSplit({"a": 1, "b": 2}) == VersionSplit({"b": 2.0, "a": 1.0})
    assert VersionSplit({"a": 1}) != VersionSplit({"a": 2})
    assert VersionSplit({"a": 1}).weights == {"a": 1.0}


@pytest.mark.parametrize(
    ("weight", "shown"),
    [
        (-1.0, "-1.0"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (MAX_WEIGHT + 1, "1000001.0"),
    ],
)
def test_a_weight_outside_0_to_max_is_refused_naming_the_version(weight: float, shown: str) -> None:
    with pytest.raises(ValueError) as err:
        VersionSplit({"v1": 50.0, "v2": weight})
    assert (
        str(err.value) == f"the weight of version 'v2' must be 0 or in [1e-06, 1e+06], got {shown}"
    )


def test_max_weight_itself_is_allowed() -> None:
    assert VersionSplit({"v1": MAX_WEIGHT}).weights == {"v1": MAX_WEIGHT}


@pytest.mark.parametrize("weights", [{}, {"a": 0.0}, {"a": 0.0, "b": 0.0}])
def test_all_zero_or_no_weights_are_refused(weights: dict[str, float]) -> None:
    with pytest.raises(ValueError) as err:
        VersionSplit(weights)
    assert str(err.value) == "at least one version needs a weight above 0"


@pytest.mark.parametrize("weight", [1e-320, 5e-324, 1e-7])
def test_a_weight_so_small_its_score_overflows_is_refused(weight: float) -> None:
    """Under MIN_WEIGHT, -ln(u)/w is infinite and no version would win a key."""
    with pytest.raises(ValueError) as err:
        VersionSplit({"v1": weight, "v2": 0})
    assert str(err.value) == (
        f"the weight of version 'v1' must be 0 or in [1e-06, 1e+06], got {weight!r}"
    )


def test_at_the_smallest_weight_every_key_still_gets_a_version() -> None:
    split = VersionSplit({"v1": MIN_WEIGHT})
    rng = random.Random(3)
    assert all(split.choose(rng.getrandbits(64)) == "v1" for _ in range(10_000))


def test_a_split_names_at_most_max_versions() -> None:
    with pytest.raises(ValueError) as err:
        VersionSplit({f"v{i}": 1 for i in range(MAX_VERSIONS + 1)})
    assert str(err.value) == f"a split names at most {MAX_VERSIONS} versions, got 65"
