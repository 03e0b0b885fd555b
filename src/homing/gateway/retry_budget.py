"""Retry budget: how many retries a model's requests may add to its pool.

Rule of the file: pure bookkeeping on an injected clock, no I/O. Each routed request
deposits into its model's `RetryBudget` (`record_request`); a retry may go ahead only while
it fits (`allows`) and is then counted (`spend`). The rule is Finagle's `RetryBudget` (and
Envoy's retry budget in spirit): over a sliding window of `window_s` seconds,

    retries + 1 <= ratio * requests + min_retries_per_s * window_s

so retries stay within `ratio` of the traffic (a pool that fails everything sees at most
`1 + ratio` times its load, not twice it), and a quiet pool can still retry
`min_retries_per_s` requests a second. Defaults (ratio 0.2, 3 retries/s, 10 s) follow
Finagle's (`percentCanRetry` 0.2, `minRetriesPerSec` 10, `ttl` 10 s) with a smaller floor,
as homing retries once per request at most by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from homing.obs.window import WindowedSums

if TYPE_CHECKING:
    from homing.config import RouterSettings

#: Bucket width of the sliding window, seconds (the window moves in steps of this).
RESOLUTION_S = 1.0


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of failed worker calls (`[router]` `max_retries`, `retry_budget_ratio`,
    `retry_min_per_s`, `retry_window_s`).

    `max_retries`: retries one request may make before its first byte reaches the client
    (0: none), each on a worker it has not tried. `ratio`, `min_retries_per_s` (retries/s)
    and `window_s` (seconds): the model's budget (module docstring). Raises `ValueError`
    for a negative count or ratio, or a window shorter than one bucket (`RESOLUTION_S`).
    """

    max_retries: int = 2
    ratio: float = 0.2
    min_retries_per_s: float = 3.0
    window_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.ratio < 0 or self.min_retries_per_s < 0:
            raise ValueError("max_retries, ratio and min_retries_per_s must be >= 0")
        if self.window_s < RESOLUTION_S:
            raise ValueError(f"window_s must be at least {RESOLUTION_S:g} s")

    @classmethod
    def from_router(cls, router: RouterSettings) -> RetryPolicy:
        """The policy a `[router]` section configures."""
        return cls(
            max_retries=router.max_retries,
            ratio=router.retry_budget_ratio,
            min_retries_per_s=router.retry_min_per_s,
            window_s=router.retry_window_s,
        )


class RetryBudget:
    """One model's retry budget over a sliding window (module docstring).

    `now`: the clock (seconds, monotonic). Memory: `window_s / RESOLUTION_S + 1` buckets of
    two counts. `policy` may be replaced (`configure`); the counts are kept.
    """

    def __init__(self, policy: RetryPolicy, *, now: Callable[[], float]) -> None:
        self.policy = policy
        self._now = now
        self._sums = self._window(policy.window_s)

    def _window(self, window_s: float) -> WindowedSums:
        return WindowedSums(
            ("requests", "retries"), now=self._now, horizon_s=window_s, resolution_s=RESOLUTION_S
        )

    def configure(self, policy: RetryPolicy) -> None:
        """Apply a new policy; a new window length starts the counts afresh."""
        if policy.window_s != self.policy.window_s:
            self._sums = self._window(policy.window_s)
        self.policy = policy

    def record_request(self) -> None:
        """A request was routed (its first attempt): one deposit."""
        self._sums.add((1.0, 0.0))

    def balance(self) -> float:
        """Retries the window still allows now (may be fractional or negative)."""
        p = self.policy
        sums = self._sums.sums(p.window_s)
        return p.ratio * sums["requests"] + p.min_retries_per_s * p.window_s - sums["retries"]

    def allows(self) -> bool:
        """Whether one more retry fits the budget now (nothing is counted)."""
        return self.balance() >= 1.0

    def spend(self) -> None:
        """Count a retry that went ahead."""
        self._sums.add((0.0, 1.0))

    def refund(self) -> None:
        """Give back a retry `try_spend` reserved that did not go ahead (no other worker)."""
        self._sums.add((0.0, -1.0))

    def try_spend(self) -> bool:
        """`allows()`, and if so `spend()`; whether the retry may go ahead."""
        if not self.allows():
            return False
        self.spend()
        return True
