"""Plain data of the quota stores: what a request asks for, what a store answers.

Rule of this file: frozen dataclasses, one protocol, one exception; no behaviour. Times are
integer milliseconds of the store's clock; token counts are tokens; a limit of None is
unlimited. A request is charged under one or more scopes (its tenant, and its API key
when the key has limits of its own) and is admitted only when every limit of every scope
has room, atomically: a refused request charges nothing anywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

QuotaKind = Literal["requests", "tokens", "streams"]


@dataclass(frozen=True)
class ScopeLimits:
    """The limits of one scope (`scope` e.g. "t:acme" or "k:acme-prod").

    `requests` and `tokens` per sliding window; `streams` at once.
    """

    scope: str
    requests: int | None = None
    tokens: int | None = None
    streams: int | None = None


@dataclass(frozen=True)
class Charge:
    """One request's claim: a unique `charge_id`, the `tokens` reserved at admission
    (prompt + n * max_tokens), and the scopes it counts under."""

    charge_id: str
    tokens: int
    scopes: tuple[ScopeLimits, ...]

    @property
    def holds_streams(self) -> bool:
        """Whether any scope limits concurrent streams (so a slot is taken and leased)."""
        return any(s.streams is not None for s in self.scopes)


@dataclass(frozen=True)
class Denial:
    """Why a charge was refused: the binding limit (the one with the longest wait).

    `used`: what the scope had in use (requests, tokens or streams); `requested`: what this
    request asked for. `retry_after_ms`: when enough will have freed; None when waiting
    cannot help (`requested > limit`), -1 when unknown (live streams end when they end; a
    slot a crashed instance left behind gives the ms until its lease runs out).
    """

    scope: str
    kind: QuotaKind
    limit: int
    used: int
    requested: int
    retry_after_ms: int | None


@dataclass(frozen=True)
class ScopeUsage:
    """What one scope holds now: `requests` and `tokens` in the sliding window, `streams`
    slots live. A kind the scope does not limit is not counted by the stores (0)."""

    requests: int = 0
    tokens: int = 0
    streams: int = 0


class QuotaStoreError(Exception):
    """The store could not be reached or did not answer in time."""


class QuotaStore(Protocol):
    """Atomic quota state shared by the instances that use the same store.

    `window_ms`: the sliding window of request and token limits; `lease_ms`: how long a
    stream slot lives without renewal. Every method may raise `QuotaStoreError`.
    """

    async def reserve(self, charge: Charge) -> Denial | None:
        """Check every limit of every scope; charge all of them, or none and say why.

        Idempotent per `charge_id`: a charge already recorded is admitted again without
        being charged twice (so a retried call is safe)."""
        ...

    async def settle(self, charge: Charge, tokens: int, *, refund: bool = False) -> int:
        """Replace the reserved tokens by `tokens` (the engine's count) where the charge is
        still in the window, and release its stream slots; the number of slots released
        (0 when they were already released or expired, so a repeat releases nothing).

        `refund`: the request never reached an engine (a 503, a reserve whose reply was
        lost): take its request and token entries out too, as if never admitted."""
        ...

    async def renew(self, charges: Sequence[Charge]) -> None:
        """Extend the stream leases of running requests by `lease_ms` from now."""
        ...

    async def usage(self, scope: str) -> ScopeUsage:
        """What `scope` holds now (read only: charges nothing, expires nothing)."""
        ...

    async def ping(self) -> None:
        """Check the store answers."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
