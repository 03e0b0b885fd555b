"""Leader election for the autoscaler: which of several gateway instances actuates a pool.

Rule of this file: exactly one instance may start and stop a pool's replicas at a time; the
others follow. An `Elector` campaigns for a lease named after the pool and renews it while it
leads; every acquisition gets a fencing token strictly greater than any earlier one of that
lease, so an actuation by a deposed leader that still believes it leads can be recognised
(`still_leader(token)` asks the store). Leadership by our own reckoning (`Tenure`) runs from
the moment the last successful acquire or renew was *sent* (the store's expiry starts later)
for `lease_s` of the injected clock: a renew that fails (store down, timeout) keeps it only
until then, so two leaders never overlap by that reckoning. Store errors are logged
(`scaler_leader_*` structlog events) and never raised out of `run()`; cancelling `run()`
releases a held lease so that a clean stop hands over at once (`abandon()` first skips that,
as a process that dies would).

Backends: `SingleElector` (one instance, the default: always leader, token 1);
`RedisElector` (a key with PX expiry set by Lua scripts, the token from INCR of a counter
key); `KubernetesElector` (`homing.scaler.leader_kubernetes`: a coordination.k8s.io/v1 Lease
written by replace with the read resourceVersion, the token its leaseTransitions). A
Kubernetes follower judges a holder's lease expired by its own clock, leaseDurationSeconds
after it first saw the Lease's current resourceVersion (as client-go's leaderelection does),
not by the holder's wall-clock renewTime, so clock skew between hosts does not matter.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from homing.clock import Clock
from homing.scaler.actuators.base import Listeners

log = structlog.get_logger("homing.scaler")

#: The shortest follower wait between two campaign rounds, in clock seconds (a store that
#: reports a lease as about to expire is not polled in a busy loop).
MIN_WAIT_S = 0.001
#: Why a leader whose renews kept failing steps down.
RAN_OUT = "lease ran out by our own clock (no renew succeeded in time)"


class Elector(Protocol):
    """Campaigns for one pool's lease (see the module docstring)."""

    kind: str  # "redis", "kubernetes", "single"
    campaigns: bool  # whether `run` must run for it to lead (False: always leader)

    @property
    def is_leader(self) -> bool:
        """Whether this instance leads now, by its own reckoning."""
        ...

    @property
    def token(self) -> int | None:
        """The fencing token of the current leadership; None when not leader."""
        ...

    @property
    def store_error(self) -> str | None:
        """Why the last round could not reach the lease store; None when it could."""
        ...

    def subscribe(self, listener: Callable[[bool], None]) -> Callable[[], None]:
        """Call `listener(is_leader)` on every change; returns the unsubscribe."""
        ...

    async def run(self) -> None:
        """Campaign and renew until cancelled; on cancel release the lease if held."""
        ...

    async def still_leader(self, token: int) -> bool:
        """Whether the store holds this instance's lease with `token` now (False when it
        cannot be asked)."""
        ...


class Tenure:
    """Leadership by our own reckoning: a token, valid until `valid_until` (clock seconds).

    `granted(token, sent)` / `renewed(sent)` record a successful acquire / renew whose
    request was sent at clock time `sent`: valid until `sent + lease_s`. Pure; no I/O.
    """

    def __init__(self, lease_s: float) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be positive, not {lease_s}")
        self.lease_s = lease_s
        self.token: int | None = None
        self.valid_until = -math.inf

    def granted(self, token: int, sent: float) -> None:
        """A new leadership with `token`, acquired by a request sent at `sent`."""
        self.token = token
        self.valid_until = sent + self.lease_s

    def renewed(self, sent: float) -> None:
        """The lease was renewed by a request sent at `sent` (never shortens it)."""
        self.valid_until = max(self.valid_until, sent + self.lease_s)

    def ended(self) -> None:
        """Not leader any more."""
        self.token = None
        self.valid_until = -math.inf

    def held(self, now: float) -> bool:
        """Whether a token is held and its lease has not run out by `now`."""
        return self.token is not None and now < self.valid_until

    def left_s(self, now: float) -> float:
        """Seconds of the lease left at `now` (0 when not held)."""
        return max(0.0, self.valid_until - now) if self.token is not None else 0.0


@dataclass
class Observed:
    """What a follower last saw of someone else's lease, for judging it expired by its own
    clock: `version` (anything that changes on every renew), seen first at `since` (clock
    seconds), with a lease of `duration_s`. Pure; no I/O."""

    version: str
    since: float
    duration_s: float

    @staticmethod
    def update(last: Observed | None, version: str, duration_s: float, now: float) -> Observed:
        """The observation after seeing `version` at `now`: the same start when the version
        is unchanged, else a new one from `now`."""
        if last is not None and last.version == version:
            return Observed(version, last.since, duration_s)
        return Observed(version, now, duration_s)

    def expired(self, now: float) -> bool:
        """Whether `duration_s` has passed since the version was first seen."""
        return now >= self.since + self.duration_s

    def left_s(self, now: float) -> float:
        """Seconds until it counts as expired (0 once it does)."""
        return max(0.0, self.since + self.duration_s - now)


class SingleElector:
    """One instance: always leader with token 1; `run()` only waits to be cancelled."""

    def __init__(self) -> None:
        self.kind = "single"
        self.campaigns = False  # `run` only waits: no task needs to run it
        self.store_error: str | None = None  # no store: never an error

    @property
    def is_leader(self) -> bool:
        """Always True."""
        return True

    @property
    def token(self) -> int | None:
        """Always 1."""
        return 1

    def subscribe(self, listener: Callable[[bool], None]) -> Callable[[], None]:
        """Nothing ever changes: `listener` is never called."""
        return lambda: None

    async def run(self) -> None:
        """Wait until cancelled."""
        await asyncio.Event().wait()

    async def still_leader(self, token: int) -> bool:
        """Whether `token` is 1."""
        return token == 1


class _Campaign:
    """The loop both store-backed electors share: a round (`_round`) then a wait of the
    round's choosing, until cancelled; then `_release` when a lease is held."""

    kind: str
    campaigns = True

    def __init__(
        self, *, name: str, identity: str, clock: Clock, lease_s: float, renew_s: float | None
    ) -> None:
        if renew_s is None:
            renew_s = lease_s / 3
        if not 0 < renew_s < lease_s:
            raise ValueError(f"renew_s must be in (0, lease_s={lease_s}), not {renew_s}")
        self.name = name
        self.identity = identity
        self.lease_s = lease_s
        self.renew_s = renew_s
        self.rounds = 0  # campaign/renew rounds completed (for tests and diagnostics)
        self.holder: str | None = None  # the identity that held the lease at the last look
        self.store_error: str | None = None  # why the last round failed; None: it worked
        self._clock = clock
        self._tenure = Tenure(lease_s)
        self._listeners: Listeners[[bool]] = Listeners("scaler_leader_listener_failed")
        self._abandoned = False
        self._running = False

    @property
    def is_leader(self) -> bool:
        """Whether this instance leads now, by its own reckoning."""
        return self._tenure.token is not None

    @property
    def token(self) -> int | None:
        """The fencing token of the current leadership; None when not leader."""
        return self._tenure.token

    def subscribe(self, listener: Callable[[bool], None]) -> Callable[[], None]:
        """Call `listener(is_leader)` on every change; returns the unsubscribe."""
        return self._listeners.subscribe(listener)

    def abandon(self) -> None:
        """Make the next cancel of `run()` leave the lease held in the store, as a process
        that dies would (the lease then runs out on the store's own expiry)."""
        self._abandoned = True

    async def run(self) -> None:
        """Rounds until cancelled; on cancel release the lease if held (not after
        `abandon()`) and stop leading. Store errors are logged, not raised."""
        self._abandoned = False
        self._running = True
        try:
            while True:
                try:
                    wait = await self._round()
                    self.store_error = None
                except Exception as error:  # the store failed (or timed out): log, go on
                    log.warning("scaler_leader_store_failed", **self._fields(error=error))
                    self.store_error = " ".join(self._describe(error).split()).rstrip(":")
                    wait = self._after_failure()
                self.rounds += 1
                await self._clock.sleep(max(MIN_WAIT_S, wait))
        finally:
            self._running = False
            held = self._tenure.token
            if held is not None and not self._abandoned:
                try:
                    async with self._clock.timeout(self.renew_s):
                        await self._release(held)
                    log.info("scaler_leader_released", **self._fields(token=held))
                except Exception as error:  # the lease then runs out on its own
                    log.warning("scaler_leader_release_failed", **self._fields(error=error))
            self._lose(None)
            await self._close()

    def _after_failure(self) -> float:
        """After a failed round: step down once the lease ran out by our own clock; the
        wait before the next round (never past the lease's end while leading)."""
        now = self._clock.now()
        if self._tenure.token is None:
            return self.renew_s
        if not self._tenure.held(now):
            self._lose(RAN_OUT)
            return self.renew_s
        return min(self.renew_s, self._tenure.left_s(now))

    def _win(self, token: int, sent: float) -> None:
        self._tenure.granted(token, sent)
        self.holder = self.identity
        log.info("scaler_leader_acquired", **self._fields(token=token))
        self._listeners.notify(True)

    def _lose(self, reason: str | None) -> None:
        token = self._tenure.token
        if token is None:
            return
        self._tenure.ended()
        if reason is not None:
            log.warning("scaler_leader_lost", **self._fields(token=token, reason=reason))
        self._listeners.notify(False)

    def _fields(self, **extra: object) -> dict[str, object]:
        fields: dict[str, object] = {"backend": self.kind, "pool": self.name}
        fields["identity"] = self.identity
        for key, value in extra.items():
            fields[key] = self._describe(value) if isinstance(value, BaseException) else value
        return fields

    def _describe(self, error: BaseException) -> str:
        """How a store error reads in logs and `store_error`."""
        return _describe(error)

    async def _round(self) -> float:
        """One acquire-or-renew; returns the clock seconds to wait before the next. Raises
        what the store raises (a renew: TimeoutError once the lease runs out meanwhile)."""
        raise NotImplementedError

    async def _release(self, token: int) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        """Free what `run()` opened."""


# -- Redis -----------------------------------------------------------------------------------

# KEYS: lease, token counter.  ARGV: identity, lease ms, the highest token this instance has
# seen.  A lease absent, or held by this identity (a reply it never got), is taken with a
# new token (the counter's INCR, raised above the floor should the counter have been lost).
# Returns {1, value, pttl} when taken, else {0, the holder's value, its pttl}.
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local owner = string.match(cur, '^(.*) %d+$')
  if owner ~= ARGV[1] then
    return {0, cur, redis.call('PTTL', KEYS[1])}
  end
end
local t = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if t <= floor then
  t = floor + 1
  redis.call('SET', KEYS[2], t)
end
local v = ARGV[1] .. ' ' .. t
redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
return {1, v, tonumber(ARGV[2])}
"""

# KEYS: lease.  ARGV: "identity token", lease ms.  Returns 1 when renewed, 0 when not ours.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: lease.  ARGV: "identity token".  Deletes it if ours; returns 1 when it did.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _token_of(value: str | None) -> int | None:
    """The token of a lease value "identity token" (None when it has none)."""
    if not value:
        return None
    _, _, tail = value.rpartition(" ")
    return int(tail) if tail.isdigit() else None


class RedisElector(_Campaign):
    """A pool's lease in Redis: key `{key_prefix}:scaler:leader:{name}` holding
    "identity token" with PX `lease_s`, tokens from `...:{name}:token` (module docstring).

    `client`: a `redis.asyncio.Redis` (its socket timeouts bound each call in real time; a
    renew is also bounded by the lease left on `clock`). `identity`: unique per instance
    (e.g. hostname:pid:random), without spaces at the end. A leader renews every `renew_s`
    (default lease_s / 3); a follower tries again every `renew_s`, or as the holder's lease
    runs out when that is sooner (its PTTL), so a dead leader is replaced within one lease.
    Tokens stay monotonic while Redis keeps the counter key; should it be lost (a restart
    without persistence), each instance still never takes a token at or below the highest
    one it has seen.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        name: str,
        identity: str,
        clock: Clock,
        lease_s: float = 10.0,
        renew_s: float | None = None,
        key_prefix: str = "homing",
    ) -> None:
        super().__init__(
            name=name, identity=identity, clock=clock, lease_s=lease_s, renew_s=renew_s
        )
        self.kind = "redis"
        self.key = f"{key_prefix}:scaler:leader:{name}"
        self.token_key = f"{self.key}:token"
        self._redis = client
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release_script = client.register_script(_RELEASE)
        self._floor = 0  # the highest token seen
        self._lease_ms = max(1, int(lease_s * 1000))

    def _value(self, token: int) -> str:
        return f"{self.identity} {token}"

    async def _round(self) -> float:
        now = self._clock.now()
        token = self._tenure.token
        if token is not None:
            if not self._tenure.held(now):
                self._lose(RAN_OUT)
            else:
                async with self._clock.timeout(self._tenure.left_s(now)):
                    renewed = await self._renew(
                        keys=[self.key], args=[self._value(token), self._lease_ms]
                    )
                if renewed:
                    self._tenure.renewed(now)
                    return min(self.renew_s, self._tenure.left_s(self._clock.now()))
                self._lose("the lease is not ours in Redis any more")
        return await self._campaign()

    async def _campaign(self) -> float:
        sent = self._clock.now()
        reply = await self._acquire(
            keys=[self.key, self.token_key], args=[self.identity, self._lease_ms, self._floor]
        )
        won, value, pttl = int(reply[0]), _text(reply[1]), int(reply[2])
        token = _token_of(value)
        if token is not None:
            self._floor = max(self._floor, token)
        if won and token is not None:
            self._win(token, sent)
            return self.renew_s
        self.holder = value.rpartition(" ")[0] if value else None
        # Wake as the holder's lease runs out (pttl < 0: no expiry or just gone).
        return min(self.renew_s, pttl / 1000) if pttl > 0 else self.renew_s

    async def _release(self, token: int) -> None:
        await self._release_script(keys=[self.key], args=[self._value(token)])

    async def still_leader(self, token: int) -> bool:
        """Whether the lease key holds "identity token" now (False when Redis fails)."""
        try:
            value = _text(await self._redis.get(self.key))
        except (RedisError, OSError) as error:
            log.warning("scaler_leader_store_failed", **self._fields(error=error))
            return False
        return value == self._value(token)


def _describe(error: BaseException) -> str:
    """ "Type: message" of a store error."""
    return f"{type(error).__name__}: {error}"
