"""The quota math, pure: sliding-window logs for requests and tokens, leases for streams.

Rule of this file: no I/O and no clock reads; every method takes `now_ms` (integer
milliseconds). The Redis backend (`homing.gateway.quotas.redis_store`) runs the same
algorithm in Lua, and the contract tests run one scenario list against both.

Sliding-window log (exact, no boundary burst): an admitted request adds an entry
`(t, id, cost)`; the entry counts while `now < t + window`. A request of cost c is admitted
when `used + c <= limit`. Otherwise it must wait until the oldest entries whose costs sum to
at least `used + c - limit` have expired: `retry_after = t_k + window - now` for the k-th
oldest entry that makes the freed sum large enough. A cost larger than the limit can never
be admitted (`retry_after` None). Reconciliation replaces an entry's cost in place (the
entry keeps its time); an entry already expired is left alone.

Leases: a stream slot is `(id, expiry)`; slots with `expiry <= now` are gone. A slot is taken
when fewer than `limit` are live, renewed by moving its expiry, released by removing it
(removal of an absent slot does nothing, so release is idempotent).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from homing.clock import Clock
from homing.gateway.quotas.types import Charge, Denial, QuotaKind, ScopeUsage


@dataclass
class SlidingWindow:
    """Entries `(t_ms, id)` in time order with their costs; `used` is the live total."""

    window_ms: int
    entries: deque[tuple[int, str]] = field(default_factory=deque)
    costs: dict[str, int] = field(default_factory=dict)
    used: int = 0

    def expire(self, now_ms: int) -> None:
        """Drop entries with `t + window <= now`."""
        cutoff = now_ms - self.window_ms
        while self.entries and self.entries[0][0] <= cutoff:
            _, entry_id = self.entries.popleft()
            self.used -= self.costs.pop(entry_id, 0)

    def wait_ms(self, cost: int, limit: int, now_ms: int) -> int | None:
        """Milliseconds until `cost` fits under `limit` (0 = now, None = never); call
        `expire(now_ms)` first."""
        if cost > limit:
            return None
        need = self.used + cost - limit
        if need <= 0:
            return 0
        freed = 0
        for t, entry_id in self.entries:
            freed += self.costs.get(entry_id, 0)
            if freed >= need:
                return t + self.window_ms - now_ms
        return None  # unreachable while used == sum(costs)

    def add(self, entry_id: str, cost: int, now_ms: int) -> None:
        """Record an admitted entry at `now_ms`."""
        self.entries.append((now_ms, entry_id))
        self.costs[entry_id] = cost
        self.used += cost

    def remove(self, entry_id: str) -> None:
        """Take an entry out as if never added (a refund); nothing when it has expired."""
        cost = self.costs.pop(entry_id, None)
        if cost is None:
            return
        self.used -= cost
        self.entries = deque(e for e in self.entries if e[1] != entry_id)

    def adjust(self, entry_id: str, cost: int) -> None:
        """Replace a live entry's cost (reconciliation); nothing when it has expired."""
        old = self.costs.get(entry_id)
        if old is not None:
            self.costs[entry_id] = cost
            self.used += cost - old


@dataclass
class LeaseSet:
    """Stream slots `id -> expiry_ms`."""

    expiry: dict[str, int] = field(default_factory=dict)

    def expire(self, now_ms: int) -> None:
        """Drop slots whose lease ran out (`expiry <= now`)."""
        for slot_id in [s for s, e in self.expiry.items() if e <= now_ms]:
            del self.expiry[slot_id]

    @property
    def used(self) -> int:
        """Live slots (call `expire` first)."""
        return len(self.expiry)

    def take(self, slot_id: str, until_ms: int) -> None:
        """Take a slot leased until `until_ms`."""
        self.expiry[slot_id] = until_ms

    def renew(self, slot_id: str, until_ms: int) -> None:
        """Move a live slot's expiry; a slot already gone is not brought back."""
        if slot_id in self.expiry:
            self.expiry[slot_id] = until_ms

    def release(self, slot_id: str) -> int:
        """Remove a slot; 1 if it was live, else 0."""
        return 1 if self.expiry.pop(slot_id, None) is not None else 0

    def wait_ms(self, now_ms: int, lease_ms: int) -> int:
        """When a slot will certainly free, for a full set (call `expire` first): the ms
        until the soonest expiry when that slot's holder stopped renewing it (less than half
        its lease left: a running request renews it every third of a lease, so only a
        crashed instance's slot gets that low), else -1 (live streams end when they end)."""
        if not self.expiry:
            return -1
        left = min(self.expiry.values()) - now_ms
        return left if left < lease_ms / 2 else -1


def binding(denials: Sequence[Denial]) -> Denial | None:
    """The denial to report: one that can never pass, else the longest known wait, else
    (only stream limits hit) the first."""
    if not denials:
        return None
    never = [d for d in denials if d.retry_after_ms is None]
    if never:
        return never[0]
    return max(denials, key=lambda d: d.retry_after_ms or 0)


class InProcessQuotaStore:
    """The single-instance backend: `SlidingWindow`s and `LeaseSet`s per scope in memory.

    Time comes from `clock` (seconds, converted to integer ms). Never raises
    `QuotaStoreError`. Idle scopes are dropped on their next use once empty.
    """

    def __init__(self, *, clock: Clock, window_ms: int, lease_ms: int) -> None:
        self.clock = clock
        self.window_ms = window_ms
        self.lease_ms = lease_ms
        self._requests: dict[str, SlidingWindow] = {}
        self._tokens: dict[str, SlidingWindow] = {}
        self._streams: dict[str, LeaseSet] = {}

    def _now(self) -> int:
        return int(self.clock.now() * 1000)

    def _window(self, table: dict[str, SlidingWindow], scope: str, now: int) -> SlidingWindow:
        window = table.get(scope)
        if window is None:
            window = table[scope] = SlidingWindow(self.window_ms)
        window.expire(now)
        return window

    def _leases(self, scope: str, now: int) -> LeaseSet:
        leases = self._streams.get(scope)
        if leases is None:
            leases = self._streams[scope] = LeaseSet()
        leases.expire(now)
        return leases

    def reserve_now(self, charge: Charge, now: int) -> Denial | None:
        """`reserve` at `now` (ms): check all limits, then charge all or nothing (a charge
        already recorded is admitted without a second charge)."""
        for s in charge.scopes:
            if (
                (s.requests is not None and self._has(self._requests, s.scope, charge))
                or (s.tokens is not None and self._has(self._tokens, s.scope, charge))
                or (s.streams is not None and charge.charge_id in self._leases(s.scope, now).expiry)
            ):
                return None
        denials: list[Denial] = []
        for s in charge.scopes:
            checks: list[tuple[QuotaKind, int, int, int | None]] = []
            if s.requests is not None:
                w = self._window(self._requests, s.scope, now)
                checks.append(("requests", s.requests, w.used, w.wait_ms(1, s.requests, now)))
            if s.tokens is not None:
                w = self._window(self._tokens, s.scope, now)
                wait = w.wait_ms(charge.tokens, s.tokens, now)
                checks.append(("tokens", s.tokens, w.used, wait))
            if s.streams is not None:
                leases = self._leases(s.scope, now)
                wait = 0 if leases.used < s.streams else leases.wait_ms(now, self.lease_ms)
                checks.append(("streams", s.streams, leases.used, wait))
            for kind, limit, used, wait in checks:
                if wait != 0:
                    requested = charge.tokens if kind == "tokens" else 1
                    denials.append(Denial(s.scope, kind, limit, used, requested, wait))
        denial = binding(denials)
        if denial is not None:
            return denial
        for s in charge.scopes:
            if s.requests is not None:
                self._requests[s.scope].add(charge.charge_id, 1, now)
            if s.tokens is not None:
                self._tokens[s.scope].add(charge.charge_id, charge.tokens, now)
            if s.streams is not None:
                self._streams[s.scope].take(charge.charge_id, now + self.lease_ms)
        return None

    @staticmethod
    def _has(table: dict[str, SlidingWindow], scope: str, charge: Charge) -> bool:
        window = table.get(scope)
        return window is not None and charge.charge_id in window.costs

    def settle_now(self, charge: Charge, tokens: int, now: int, *, refund: bool = False) -> int:
        """`settle` at `now` (ms)."""
        released = 0
        for s in charge.scopes:
            if refund and s.requests is not None and s.scope in self._requests:
                self._window(self._requests, s.scope, now).remove(charge.charge_id)
            if s.tokens is not None and s.scope in self._tokens:
                window = self._window(self._tokens, s.scope, now)
                if refund:
                    window.remove(charge.charge_id)
                else:
                    window.adjust(charge.charge_id, tokens)
            if s.streams is not None and s.scope in self._streams:
                released += self._leases(s.scope, now).release(charge.charge_id)
        self._drop_idle()
        return released

    def renew_now(self, charges: Sequence[Charge], now: int) -> None:
        """`renew` at `now` (ms)."""
        for charge in charges:
            for s in charge.scopes:
                if s.streams is not None and s.scope in self._streams:
                    self._leases(s.scope, now).renew(charge.charge_id, now + self.lease_ms)

    def usage_now(self, scope: str, now: int) -> ScopeUsage:
        """`usage` at `now` (ms): live entries and slots, read without expiring any."""
        cutoff = now - self.window_ms

        def live(table: dict[str, SlidingWindow]) -> int:
            window = table.get(scope)
            if window is None:
                return 0
            return sum(window.costs.get(i, 0) for t, i in window.entries if t > cutoff)

        leases = self._streams.get(scope)
        streams = 0 if leases is None else sum(1 for e in leases.expiry.values() if e > now)
        return ScopeUsage(live(self._requests), live(self._tokens), streams)

    def _drop_idle(self) -> None:
        for table in (self._requests, self._tokens):
            for scope in [k for k, w in table.items() if not w.entries]:
                del table[scope]
        for scope in [k for k, leases in self._streams.items() if not leases.expiry]:
            del self._streams[scope]

    async def reserve(self, charge: Charge) -> Denial | None:
        """See `QuotaStore.reserve`."""
        return self.reserve_now(charge, self._now())

    async def settle(self, charge: Charge, tokens: int, *, refund: bool = False) -> int:
        """See `QuotaStore.settle`."""
        return self.settle_now(charge, tokens, self._now(), refund=refund)

    async def renew(self, charges: Sequence[Charge]) -> None:
        """See `QuotaStore.renew`."""
        self.renew_now(charges, self._now())

    async def usage(self, scope: str) -> ScopeUsage:
        """See `QuotaStore.usage`."""
        return self.usage_now(scope, self._now())

    async def ping(self) -> None:
        """Always answers."""

    async def close(self) -> None:
        """Nothing to release."""
