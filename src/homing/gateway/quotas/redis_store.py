"""The shared backend: the quota math of `homing.gateway.quotas.window`, run atomically in
Redis as Lua scripts, through the maintained `redis` client (`redis.asyncio`).

Rule of this file: each operation is one script call, so a check-and-charge across every
limit of every scope is atomic however many gateway instances share the store; a refused
request changes nothing. The scripts mirror `SlidingWindow` and `LeaseSet` line for line, and
the contract tests run the same scenarios against both.

Why scripts and not a rate-limit library: the semantics here need (a) one atomic decision
across several limits and scopes, (b) a variable cost reserved up front and reconciled
afterwards (a refund), and (c) leased concurrency slots; the maintained limiters (`limits`,
`pyrate-limiter`) check one limit per call and cannot adjust a past hit, so composing them
would either over-admit or charge refused requests.

Keys per scope (`P` = key prefix, `S` = scope; the scope is a hash tag):
`P:{S}:r` sorted set (member = charge id, score = admission time ms),
`P:{S}:t` sorted set (token entries, same), `P:{S}:c` hash (charge id -> tokens, and
`_sum`, the live total), `P:{S}:s` sorted set (stream slot -> lease expiry ms). Every key
gets a TTL of the window (or lease), so idle tenants leave nothing behind. The hash tag
only groups one scope's keys; a charge spans several scopes in one script, so Redis Cluster
is not supported (use one server, or a primary behind one URL).

Time: by default the Redis server's clock (`TIME`), so instances on different hosts agree;
a `clock` may be injected (tests drive the scripts with a `ManualClock`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from homing.clock import Clock
from homing.gateway.quotas.types import (
    Charge,
    Denial,
    QuotaKind,
    QuotaStoreError,
    ScopeUsage,
)

_COMMON = """
local function now_ms(arg)
  local now = tonumber(arg)
  if now < 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local BATCH = 500
-- SlidingWindow.expire for the token log: subtract expired costs from _sum.
local function expire_tokens(t_key, c_key, cutoff)
  while true do
    local old = redis.call('ZRANGEBYSCORE', t_key, '-inf', cutoff, 'LIMIT', 0, BATCH)
    if #old == 0 then break end
    local costs = redis.call('HMGET', c_key, unpack(old))
    local freed = 0
    for i = 1, #costs do freed = freed + (tonumber(costs[i]) or 0) end
    redis.call('HDEL', c_key, unpack(old))
    redis.call('HINCRBY', c_key, '_sum', -freed)
    redis.call('ZREM', t_key, unpack(old))
  end
  return tonumber(redis.call('HGET', c_key, '_sum') or '0')
end
"""

# KEYS: per scope r, t, c, s.  ARGV: now, window_ms, lease_ms, id, tokens, then per scope
# the request, token and stream limits (-1 = none).
# Returns {1} or {0, scope index (1-based), kind, limit, used, requested, wait}
# with wait -2 = never, -1 = unknown.
# Idempotent per charge id: a replay (redis-py retrying after a reply was lost) of a charge
# already recorded in any scope returns {1} and changes nothing.
_RESERVE = (
    _COMMON
    + """
local now = now_ms(ARGV[1])
local window = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local id = ARGV[4]
local tokens = tonumber(ARGV[5])
local n = #KEYS / 4
local cutoff = now - window
for i = 1, n do
  local r, c, s = KEYS[4*i-3], KEYS[4*i-1], KEYS[4*i]
  local rl, tl, sl = tonumber(ARGV[5+3*i-2]), tonumber(ARGV[5+3*i-1]), tonumber(ARGV[5+3*i])
  if (rl >= 0 and redis.call('ZSCORE', r, id))
      or (tl >= 0 and redis.call('HEXISTS', c, id) == 1)
      or (sl >= 0 and redis.call('ZSCORE', s, id)) then
    return {1}
  end
end
local best = nil
local function consider(d)
  if best == nil then best = d return end
  if d[7] == -2 and best[7] ~= -2 then best = d return end
  if d[7] ~= -2 and best[7] ~= -2 and d[7] > best[7] then best = d end
end
for i = 1, n do
  local r, t, c, s = KEYS[4*i-3], KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i]
  local rl, tl, sl = tonumber(ARGV[5+3*i-2]), tonumber(ARGV[5+3*i-1]), tonumber(ARGV[5+3*i])
  if rl >= 0 then
    redis.call('ZREMRANGEBYSCORE', r, '-inf', cutoff)
    local used = redis.call('ZCARD', r)
    if 1 > rl then
      consider({0, i, 'requests', rl, used, 1, -2})
    elseif used + 1 > rl then
      local k = used + 1 - rl
      local entry = redis.call('ZRANGE', r, k - 1, k - 1, 'WITHSCORES')
      consider({0, i, 'requests', rl, used, 1, tonumber(entry[2]) + window - now})
    end
  end
  if tl >= 0 then
    local used = expire_tokens(t, c, cutoff)
    if tokens > tl then
      consider({0, i, 'tokens', tl, used, tokens, -2})
    elseif used + tokens > tl then
      local need = used + tokens - tl
      local freed = 0
      local start = 0
      local wait = -2
      while wait == -2 do
        local batch = redis.call('ZRANGE', t, start, start + BATCH - 1, 'WITHSCORES')
        if #batch == 0 then break end
        local ids = {}
        for j = 1, #batch, 2 do ids[#ids + 1] = batch[j] end
        local costs = redis.call('HMGET', c, unpack(ids))
        for j = 1, #ids do
          freed = freed + (tonumber(costs[j]) or 0)
          if freed >= need then
            wait = tonumber(batch[2*j]) + window - now
            break
          end
        end
        start = start + BATCH
      end
      consider({0, i, 'tokens', tl, used, tokens, wait})
    end
  end
  if sl >= 0 then
    redis.call('ZREMRANGEBYSCORE', s, '-inf', now)
    local used = redis.call('ZCARD', s)
    if used >= sl then
      -- LeaseSet.wait_ms: a slot with under half its lease left is no longer renewed
      local wait = -1
      local first = redis.call('ZRANGE', s, 0, 0, 'WITHSCORES')
      if #first == 2 and tonumber(first[2]) - now < lease / 2 then
        wait = tonumber(first[2]) - now
      end
      consider({0, i, 'streams', sl, used, 1, wait})
    end
  end
end
if best ~= nil then return best end
for i = 1, n do
  local r, t, c, s = KEYS[4*i-3], KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i]
  local rl, tl, sl = tonumber(ARGV[5+3*i-2]), tonumber(ARGV[5+3*i-1]), tonumber(ARGV[5+3*i])
  if rl >= 0 then
    redis.call('ZADD', r, now, id)
    redis.call('PEXPIRE', r, window)
  end
  if tl >= 0 then
    redis.call('ZADD', t, now, id)
    if redis.call('HSETNX', c, id, tokens) == 1 then
      redis.call('HINCRBY', c, '_sum', tokens)
    end
    redis.call('PEXPIRE', t, window)
    redis.call('PEXPIRE', c, window)
  end
  if sl >= 0 then
    redis.call('ZADD', s, now + lease, id)
    redis.call('PEXPIRE', s, lease)
  end
end
return {1}
"""
)

# KEYS: per scope r, t, c, s.  ARGV: now, window_ms, id, tokens, refund ('1' = also take
# the request and token entries out, as if the request had never been admitted), then per
# scope three flags (request, token, stream limit: 1 = present).  Returns the number of
# slots released.
_SETTLE = (
    _COMMON
    + """
local now = now_ms(ARGV[1])
local window = tonumber(ARGV[2])
local id = ARGV[3]
local tokens = tonumber(ARGV[4])
local refund = ARGV[5] == '1'
local released = 0
for i = 1, #KEYS / 4 do
  local r, t, c, s = KEYS[4*i-3], KEYS[4*i-2], KEYS[4*i-1], KEYS[4*i]
  if refund and ARGV[5+3*i-2] == '1' then
    redis.call('ZREM', r, id)
  end
  if ARGV[5+3*i-1] == '1' then
    expire_tokens(t, c, now - window)
    local old = redis.call('HGET', c, id)
    if old and refund then
      redis.call('HDEL', c, id)
      redis.call('ZREM', t, id)
      redis.call('HINCRBY', c, '_sum', -tonumber(old))
    elseif old then
      redis.call('HSET', c, id, tokens)
      redis.call('HINCRBY', c, '_sum', tokens - tonumber(old))
    end
  end
  if ARGV[5+3*i] == '1' then
    redis.call('ZREMRANGEBYSCORE', s, '-inf', now)
    released = released + redis.call('ZREM', s, id)
  end
end
return released
"""
)

# KEYS: stream sets; ARGV: now, lease_ms, then one charge id per key.
_RENEW = (
    _COMMON
    + """
local now = now_ms(ARGV[1])
local lease = tonumber(ARGV[2])
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  redis.call('ZADD', KEYS[i], 'XX', now + lease, ARGV[2 + i])
  redis.call('PEXPIRE', KEYS[i], lease)
end
return 1
"""
)

# KEYS: one scope's r, t, c, s.  ARGV: now, window_ms.  Returns {requests, tokens, streams}
# live now (entries with t > now - window, slots with expiry > now), the same counts
# `InProcessQuotaStore.usage_now` reads; writes nothing.
_USAGE = (
    _COMMON
    + """
local now = now_ms(ARGV[1])
local cutoff = now - tonumber(ARGV[2])
local requests = redis.call('ZCOUNT', KEYS[1], '(' .. cutoff, '+inf')
local tokens = 0
local start = 0
while true do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. cutoff, '+inf', 'LIMIT', start, BATCH)
  if #ids == 0 then break end
  local costs = redis.call('HMGET', KEYS[3], unpack(ids))
  for i = 1, #costs do tokens = tokens + (tonumber(costs[i]) or 0) end
  start = start + BATCH
end
local streams = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
return {requests, tokens, streams}
"""
)


def _limit(value: int | None) -> int:
    return -1 if value is None else value


class RedisQuotaStore:
    """`QuotaStore` on Redis at `url` (`redis://host:port/db`, `rediss://` for TLS).

    `timeout_s` (seconds) bounds each call (connect included); a call that fails on a
    connection error or timeout is retried once on a fresh connection, which is safe
    because every script is idempotent per charge id (a replayed reserve charges nothing
    twice; settle and renew set, not add). Errors become `QuotaStoreError`.

    One Redis server (or a primary with replicas behind one URL); Redis Cluster is not
    supported (the scripts touch several scopes' keys, which Cluster would refuse across
    hash slots).
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str,
        window_ms: int,
        lease_ms: int,
        timeout_s: float,
        clock: Clock | None = None,
    ) -> None:
        self.window_ms = window_ms
        self.lease_ms = lease_ms
        self.prefix = key_prefix
        self.clock = clock
        self.redis: aioredis.Redis = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),
            decode_responses=True,
        )
        self._reserve = self.redis.register_script(_RESERVE)
        self._settle = self.redis.register_script(_SETTLE)
        self._renew = self.redis.register_script(_RENEW)
        self._usage = self.redis.register_script(_USAGE)

    def _now(self) -> int:
        return -1 if self.clock is None else int(self.clock.now() * 1000)

    def key(self, scope: str, part: str) -> str:
        """The Redis key of `part` ("r", "t", "c" or "s") of `scope`."""
        return f"{self.prefix}:{{{scope}}}:{part}"

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError) as err:
            raise QuotaStoreError(f"{type(err).__name__}: {err}") from err

    async def reserve(self, charge: Charge) -> Denial | None:
        """See `QuotaStore.reserve`."""
        keys: list[str] = []
        args: list[Any] = [
            self._now(),
            self.window_ms,
            self.lease_ms,
            charge.charge_id,
            charge.tokens,
        ]
        for s in charge.scopes:
            keys += [self.key(s.scope, p) for p in ("r", "t", "c", "s")]
            args += [_limit(s.requests), _limit(s.tokens), _limit(s.streams)]
        result = await self._call(self._reserve, keys, args)
        if int(result[0]) == 1:
            return None
        _, index, kind, limit, used, requested, wait = result
        kinds: dict[str, QuotaKind] = {"requests": "requests", "tokens": "tokens"}
        return Denial(
            scope=charge.scopes[int(index) - 1].scope,
            kind=kinds.get(str(kind), "streams"),
            limit=int(limit),
            used=int(used),
            requested=int(requested),
            retry_after_ms=None if int(wait) == -2 else int(wait),
        )

    async def settle(self, charge: Charge, tokens: int, *, refund: bool = False) -> int:
        """See `QuotaStore.settle`."""
        keys: list[str] = []
        args: list[Any] = [
            self._now(),
            self.window_ms,
            charge.charge_id,
            tokens,
            "1" if refund else "0",
        ]
        for s in charge.scopes:
            keys += [self.key(s.scope, p) for p in ("r", "t", "c", "s")]
            args += [
                "1" if s.requests is not None else "0",
                "1" if s.tokens is not None else "0",
                "1" if s.streams is not None else "0",
            ]
        return int(await self._call(self._settle, keys, args))

    async def renew(self, charges: Sequence[Charge]) -> None:
        """See `QuotaStore.renew`."""
        keys: list[str] = []
        ids: list[str] = []
        for charge in charges:
            for s in charge.scopes:
                if s.streams is not None:
                    keys.append(self.key(s.scope, "s"))
                    ids.append(charge.charge_id)
        if keys:
            await self._call(self._renew, keys, [self._now(), self.lease_ms, *ids])

    async def usage(self, scope: str) -> ScopeUsage:
        """See `QuotaStore.usage`."""
        keys = [self.key(scope, p) for p in ("r", "t", "c", "s")]
        requests, tokens, streams = await self._call(
            self._usage, keys, [self._now(), self.window_ms]
        )
        return ScopeUsage(int(requests), int(tokens), int(streams))

    async def ping(self) -> None:
        """PING the server; raises `QuotaStoreError`."""
        try:
            await self.redis.ping()
        except (RedisError, OSError) as err:
            raise QuotaStoreError(f"{type(err).__name__}: {err}") from err

    async def close(self) -> None:
        """Close the connection pool."""
        await self.redis.aclose()
