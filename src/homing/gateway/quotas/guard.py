"""The quota shell: turns a caller and a request into a store charge, and a refusal into the
error the client sees; keeps running requests' stream leases alive.

Rule of this file: the decisions are the store's (`window.py` math, or the same math in
Redis); this file does I/O and policy around them:
- `reserve` charges 1 request, prompt + n * max_tokens tokens and 1 stream slot under the
  tenant's scope (and the key's, when it has limits of its own), atomically;
- a refusal is 429 `rate_limit_exceeded` whose `type` names the quota (`requests`,
  `tokens` or `streams`, as OpenAI's `requests`/`tokens`), with an OpenAI-worded message and
  `Retry-After` = ceil(seconds until enough of that quota frees), at least 1; a request
  larger than a token limit can never pass and gets 429 without `Retry-After`;
- a store that fails gives 503 `quota_store_unavailable` with `Retry-After: 1`
  (`on_store_error = "fail_closed"`, the default) or admits the request uncounted
  (`"fail_open"`), with a metric and a log line either way; there is never a silent
  fall-back to per-instance limits;
- `settle` runs exactly once per ticket (a second call does nothing), shielded from the
  caller's cancellation, and stops the lease renewal first; if it cannot reach the store the
  slot frees itself when its lease runs out (`stream_lease_s`);
- a reserve that fails (store error, timeout) or is cancelled may still have charged (the
  reply was lost): a background refund undoes it, so it holds no slot and no quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from dataclasses import dataclass

import structlog

from homing.aio import cancel_and_wait
from homing.clock import Clock, SystemClock
from homing.config import QuotaLimits, QuotaSettings
from homing.gateway.auth import Principal
from homing.gateway.errors import APIError
from homing.gateway.metrics import GatewayMetrics
from homing.gateway.quotas.redis_store import RedisQuotaStore
from homing.gateway.quotas.types import (
    Charge,
    Denial,
    QuotaStore,
    QuotaStoreError,
    ScopeLimits,
)
from homing.gateway.quotas.window import InProcessQuotaStore

log = structlog.get_logger("homing.quota")


@dataclass
class QuotaTicket:
    """A reservation held by one request until `QuotaGuard.settle`."""

    charge: Charge
    settled: bool = False


def scopes_for(principal: Principal) -> tuple[ScopeLimits, ...]:
    """The scopes a principal's requests count under: its tenant, and its key when the key
    has limits of its own (empty when nothing is limited)."""

    def scope(name: str, limits: QuotaLimits) -> ScopeLimits:
        return ScopeLimits(
            name,
            requests=limits.requests_per_minute,
            tokens=limits.tokens_per_minute,
            streams=limits.concurrent_streams,
        )

    scopes: list[ScopeLimits] = []
    if not principal.tenant_quota.unlimited:
        scopes.append(scope(f"t:{principal.tenant}", principal.tenant_quota))
    if principal.key_quota is not None and not principal.key_quota.unlimited:
        scopes.append(scope(f"k:{principal.key_id}", principal.key_quota))
    return tuple(scopes)


def rate_limit_error(
    denial: Denial, principal: Principal, *, window_s: float, streams_retry_after_s: int
) -> APIError:
    """The 429 for `denial`, in OpenAI's words (`Rate limit reached for ... on ...`)."""
    per = "min" if window_s == 60 else f"{window_s:g} s"
    quota = {
        "requests": f"requests per {per} (RPM)" if per == "min" else f"requests per {per}",
        "tokens": f"tokens per {per} (TPM)" if per == "min" else f"tokens per {per}",
        "streams": "concurrent streams",
    }[denial.kind]
    where = (
        f"tenant {principal.tenant}"
        if denial.scope.startswith("t:")
        else f"API key {principal.key_id}"
    )
    if denial.retry_after_ms is None:
        return APIError(
            429,
            f"Request too large for {quota} on {where}: Limit {denial.limit}, Requested "
            f"{denial.requested}. The input or output tokens must be reduced in order to run "
            "successfully.",
            code="rate_limit_exceeded",
            type=denial.kind,
        )
    if denial.retry_after_ms < 0:
        retry_s = streams_retry_after_s
    else:
        retry_s = max(1, math.ceil(denial.retry_after_ms / 1000))
    return APIError(
        429,
        f"Rate limit reached for {quota} on {where}: Limit {denial.limit}, Used "
        f"{denial.used}, Requested {denial.requested}. Please try again in {retry_s}s.",
        code="rate_limit_exceeded",
        type=denial.kind,
        retry_after_s=retry_s,
    )


def store_unavailable() -> APIError:
    """503 when the quota store cannot be reached and the gateway fails closed."""
    return APIError(
        503,
        "The quota store is unavailable, so the request cannot be admitted; retry shortly.",
        code="quota_store_unavailable",
        type="service_unavailable_error",
        retry_after_s=1,
    )


def build_store(settings: QuotaSettings, clock: Clock | None = None) -> QuotaStore:
    """The configured backend. `clock`: None = the system clock (memory) or Redis server
    time (redis)."""
    window_ms = int(settings.window_s * 1000)
    lease_ms = int(settings.stream_lease_s * 1000)
    if settings.backend == "redis":
        return RedisQuotaStore(
            settings.redis_url,
            key_prefix=settings.key_prefix,
            window_ms=window_ms,
            lease_ms=lease_ms,
            timeout_s=settings.store_timeout_s,
            clock=clock,
        )
    return InProcessQuotaStore(
        clock=clock if clock is not None else SystemClock(), window_ms=window_ms, lease_ms=lease_ms
    )


class QuotaGuard:
    """Reserve and settle quota for authenticated requests over one `QuotaStore`.

    `clock`: times the lease renewals (default the system clock)."""

    def __init__(
        self,
        store: QuotaStore,
        *,
        settings: QuotaSettings,
        metrics: GatewayMetrics,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._live: dict[str, Charge] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None

    @property
    def live(self) -> int:
        """Tickets reserved and not yet settled by this instance."""
        return len(self._live)

    async def reserve(
        self, principal: Principal | None, *, tokens: int, request_id: str
    ) -> QuotaTicket | None:
        """Charge one request of `tokens` (prompt + n * max_tokens) for `principal`.

        None when nothing is limited (auth off, no limits) or the store failed open.
        Raises `APIError` 429 (a quota) or 503 (store unavailable, failing closed).
        """
        if principal is None:
            return None
        scopes = scopes_for(principal)
        if not scopes:
            return None
        charge = Charge(charge_id=uuid.uuid4().hex, tokens=tokens, scopes=scopes)
        try:
            denial = await self.store.reserve(charge)
        except asyncio.CancelledError:
            # The script may have run with its reply still in flight: undo it.
            self._compensate(charge)
            raise
        except QuotaStoreError as err:
            # A timed-out call may still have charged (the reply was lost): undo it.
            self._compensate(charge)
            action = self.settings.on_store_error
            self.metrics.quota_store_errors.labels(operation="reserve", action=action).inc()
            log.warning(
                "quota_store_unavailable",
                operation="reserve",
                action=action,
                request_id=request_id,
                tenant=principal.tenant,
                error=str(err),
            )
            if action == "fail_open":
                return None
            raise store_unavailable() from None
        if denial is not None:
            self.metrics.rate_limited.labels(quota=denial.kind, tenant=principal.tenant).inc()
            raise rate_limit_error(
                denial,
                principal,
                window_s=self.settings.window_s,
                streams_retry_after_s=self.settings.streams_retry_after_s,
            )
        if charge.holds_streams:
            self._live[charge.charge_id] = charge
        return QuotaTicket(charge)

    async def settle(
        self, ticket: QuotaTicket | None, tokens: int, *, refund: bool = False
    ) -> None:
        """Reconcile the ticket's tokens to `tokens` and release its stream slot, once.

        `refund`: the request never reached an engine (a 503 from admission or routing):
        also take its request and token entries out, so it uses up no quota at all.
        Never raises a store error (logged and counted); the store call survives the
        caller's cancellation.
        """
        if ticket is None or ticket.settled:
            return
        ticket.settled = True
        self._live.pop(ticket.charge.charge_id, None)  # no renewal from here on
        await asyncio.shield(self._background_settle(ticket.charge, tokens, refund=refund))

    def _compensate(self, charge: Charge) -> None:
        """Refund a charge whose reserve outcome is unknown, in the background."""
        self._background_settle(charge, 0, refund=True)

    def _background_settle(
        self, charge: Charge, tokens: int, *, refund: bool
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._settle(charge, tokens, refund=refund))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _settle(self, charge: Charge, tokens: int, *, refund: bool = False) -> None:
        try:
            await self.store.settle(charge, tokens, refund=refund)
        except QuotaStoreError as err:
            self.metrics.quota_store_errors.labels(operation="settle", action="none").inc()
            log.warning(
                "quota_store_unavailable",
                operation="settle",
                action="lease_expiry",
                error=str(err),
            )

    def start(self) -> None:
        """Start renewing the stream leases of running requests every third of a lease."""
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        interval = self.settings.stream_lease_s / 3
        while True:
            await self.clock.sleep(interval)
            charges = list(self._live.values())
            if not charges:
                continue
            try:
                await self.store.renew(charges)
            except QuotaStoreError as err:
                self.metrics.quota_store_errors.labels(operation="renew", action="none").inc()
                log.warning(
                    "quota_store_unavailable", operation="renew", action="retry", error=str(err)
                )

    async def stop(self) -> None:
        """Stop renewing, let pending settles finish (bounded by the store timeout), close."""
        if self._renewer is not None:
            await cancel_and_wait(self._renewer)
            self._renewer = None
        if self._pending:
            with contextlib.suppress(TimeoutError):
                async with self.clock.timeout(2 * self.settings.store_timeout_s):
                    await asyncio.wait(list(self._pending))
        await self.store.close()
