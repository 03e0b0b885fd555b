"""Which version of a model serves a request: a sticky weighted split (pure).

Rule of this file: a request's version depends only on its routing key and the weights, so
every turn of a conversation lands on one version, and a weight change moves only the keys
it must. The choice is weighted rendezvous hashing (Thaler & Ravishankar, "Using name-based
mappings to increase hit rates", IEEE/ACM ToN 6(1), 1998; the weighted form of Schindelhauer
& Schomaker, 2005): each version v with weight w > 0 scores a key k as
`-ln(u(k, v)) / w`, with u uniform in (0, 1) from `xxh3_64(v, seed=k)`, and the lowest score
wins. The scores are exponential variables of rates w, so v wins a share w / sum(w) of the
keys; raising one weight can only move keys to that version, lowering it only away from it.
From 95/5 to 75/25, 20% of the keys (those now under the canary) move, and no others.

Versions without a ready replica are left out of the race (the keys they would win go to
the remaining versions and come back when a replica does); a version of weight 0 gets no
keys, except through an explicit pin (the caller's, not decided here).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import xxhash

from homing.config.rules import check_version_weights

_SCALE = 1.0 / 2.0**64


class VersionSplit:
    """Weights of a model's versions: `weights` maps a version label to a weight >= 0 (relative:
    percent in practice); at least one must be positive. ValueError otherwise, for a
    weight that is not finite, under MIN_WEIGHT but not 0, or over MAX_WEIGHT, or for more
    than MAX_VERSIONS versions (`homing.config.rules.check_version_weights`)."""

    __slots__ = ("_order", "weights")

    def __init__(self, weights: Mapping[str, float]) -> None:
        self.weights: dict[str, float] = check_version_weights(weights)
        # Ties (equal scores) go to the first version in sorted order, whatever the mapping's.
        self._order = sorted(v for v, w in self.weights.items() if w > 0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VersionSplit) and self.weights == other.weights

    def __repr__(self) -> str:
        return f"VersionSplit({self.weights!r})"

    def shares(self) -> dict[str, float]:
        """Each version's expected share of keys in [0, 1] (weight / total)."""
        total = sum(self.weights.values())
        return {v: w / total for v, w in self.weights.items()}

    def choose(self, key: int, available: Collection[str] | None = None) -> str | None:
        """The version for routing key `key` (a uint64, `routing_key`) among the weighted
        versions in `available` (None: all of them); None when none of them is available."""
        best: str | None = None
        best_score = math.inf
        weights = self.weights
        seed = key & 0xFFFFFFFFFFFFFFFF
        for version in self._order:
            if available is not None and version not in available:
                continue
            u = (xxhash.xxh3_64_intdigest(version.encode("utf-8"), seed) + 0.5) * _SCALE
            score = -math.log(u) / weights[version]
            if score < best_score:
                best, best_score = version, score
        return best
