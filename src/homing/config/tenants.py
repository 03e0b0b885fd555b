"""Tenants (`[[tenants]]`): their API keys, models, priorities and quotas, and where quota
state lives (`[quotas]`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from homing.config.base import Section


class QuotaLimits(Section):
    """Limits of one tenant or one API key; None (absent) = unlimited.

    `requests_per_minute` and `tokens_per_minute` count over a sliding window of
    `quotas.window_s` (60 s: the names' meaning); tokens are prompt + completion, reserved
    at admission as prompt + n * max_tokens and reconciled with the engine's counts at the
    end. `concurrent_streams`: requests in flight at once (streamed or not).
    """

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    concurrent_streams: int | None = Field(default=None, ge=1)

    @property
    def unlimited(self) -> bool:
        """True when no limit is set."""
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.concurrent_streams is None
        )


class ApiKeySettings(Section):
    """One API key of a tenant, stored as the SHA-256 hex digest of the key (never the key).

    `id`: a name for logs and errors. `models`: narrows the tenant's models for this key
    (None = the tenant's). `quota`: limits of this key on top of the tenant's.
    Make a hash with `printf %s "$KEY" | sha256sum`.
    """

    id: str = Field(min_length=1, max_length=128)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    disabled: bool = False
    models: list[str] | None = None
    quota: QuotaLimits | None = None

    @field_validator("sha256")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class TenantSettings(Section):
    """A tenant: its API keys, the models it may use (None = all served), its quota and its
    admission priority (higher is served first from the admission queue)."""

    name: str = Field(min_length=1, max_length=128)
    keys: list[ApiKeySettings] = Field(min_length=1)
    models: list[str] | None = None
    priority: int = Field(default=0, ge=0, le=100)
    quota: QuotaLimits = Field(default_factory=QuotaLimits)


class QuotaSettings(Section):
    """Where quota state lives and what happens when that store fails.

    `backend`: "memory" (this process only) or "redis" (shared by every instance using the
    same `redis_url` and `key_prefix`). `on_store_error`: "fail_closed" answers 503,
    "fail_open" admits without counting; either way a metric and a log line.
    `store_timeout_s`: per store call. `window_s`: the sliding window of the per-minute
    limits. `stream_lease_s`: a stream slot's lease, renewed every third of it while the
    request runs, so a crashed instance's slots free themselves after at most this long.
    `streams_retry_after_s`: the `Retry-After` given when only the stream limit is hit
    (when a stream ends is unknown). `default_completion_reservation`: tokens reserved for
    the completion of a request that sets no `max_tokens` (capped at the room its context
    leaves); the engine's real count is charged at the end either way.
    """

    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="homing", min_length=1)
    on_store_error: Literal["fail_closed", "fail_open"] = "fail_closed"
    store_timeout_s: float = Field(default=0.5, gt=0)
    window_s: float = Field(default=60.0, gt=0)
    stream_lease_s: float = Field(default=30.0, gt=0)
    streams_retry_after_s: int = Field(default=1, ge=1)
    default_completion_reservation: int = Field(default=1024, ge=1)
