"""API keys and tenants: who is calling, and which models they may use.

Rule of this file: a presented key is hashed (SHA-256) on arrival and only the digest is
kept, compared or logged; the configured digests are compared with `hmac.compare_digest`
(constant time in the digest's content). Keys are looked up by the first 8 bytes of the
digest (a preimage-resistant bucket, so its timing tells an attacker nothing usable about a
key) and confirmed by the constant-time compare of the whole digest.

With no tenants configured, authentication is off: `KeyRing.authenticate` returns None and
every model is allowed. Errors follow OpenAI's API:
- no `Authorization: Bearer` header, an unknown key or a disabled key: 401,
  `type=invalid_request_error`, `code=invalid_api_key` (the key is never echoed);
- a model the tenant may not use: 404 `model_not_found`, the same body as for a model that
  does not exist (OpenAI does not reveal models an organisation cannot access);
- a model the tenant may use but this key may not (a key's own `models` list): 403
  `model_not_allowed`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from homing.config import QuotaLimits, TenantSettings
from homing.gateway.errors import APIError, model_not_found
from homing.gateway.metrics import GatewayMetrics

_BUCKET_BYTES = 8


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the tenant, the key's id (never the key), the models the
    tenant and key may use (None = all), the admission priority and the quota limits of the
    tenant and of the key (None when the key has none of its own)."""

    tenant: str
    key_id: str
    priority: int
    tenant_models: frozenset[str] | None
    key_models: frozenset[str] | None
    tenant_quota: QuotaLimits
    key_quota: QuotaLimits | None

    def may_see(self, model: str) -> bool:
        """Whether the tenant may use `model` (a model it may not see is 'not found')."""
        return self.tenant_models is None or model in self.tenant_models

    def may_use(self, model: str) -> bool:
        """Whether this key may use `model` (tenant and key restrictions)."""
        return self.may_see(model) and (self.key_models is None or model in self.key_models)


@dataclass(frozen=True)
class _Key:
    digest: bytes
    disabled: bool
    principal: Principal


def hash_key(key: str) -> str:
    """The SHA-256 hex digest stored in the config for `key`."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def invalid_api_key(message: str) -> APIError:
    """401 `invalid_api_key` in OpenAI's shape (`type=invalid_request_error`)."""
    return APIError(401, message, code="invalid_api_key", type="invalid_request_error")


MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
INCORRECT_KEY_MESSAGE = "Incorrect API key provided."
DISABLED_KEY_MESSAGE = "The API key provided has been disabled."


class KeyRing:
    """The configured tenants' keys, by digest. `enabled` is False when there are none.

    `metrics`: counts refusals in `homing_auth_failures_total{reason}` (missing, incorrect,
    disabled).
    """

    def __init__(
        self, tenants: Sequence[TenantSettings], metrics: GatewayMetrics | None = None
    ) -> None:
        self.metrics = metrics
        self._buckets: dict[bytes, list[_Key]] = {}
        self.enabled = False
        self.replace(tenants)

    def replace(self, tenants: Sequence[TenantSettings]) -> None:
        """Serve `tenants`' keys from now on (a configuration reload); requests already
        authenticated keep their `Principal`."""
        buckets: dict[bytes, list[_Key]] = {}
        for tenant in tenants:
            tenant_models = None if tenant.models is None else frozenset(tenant.models)
            for key in tenant.keys:
                principal = Principal(
                    tenant=tenant.name,
                    key_id=key.id,
                    priority=tenant.priority,
                    tenant_models=tenant_models,
                    key_models=None if key.models is None else frozenset(key.models),
                    tenant_quota=tenant.quota,
                    key_quota=key.quota,
                )
                digest = bytes.fromhex(key.sha256)
                entry = _Key(digest=digest, disabled=key.disabled, principal=principal)
                buckets.setdefault(digest[:_BUCKET_BYTES], []).append(entry)
        self._buckets = buckets
        self.enabled = bool(buckets)

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The caller of a request with this `Authorization` value (`Bearer KEY`).

        Returns None when authentication is off. Raises `APIError` 401 `invalid_api_key`
        for a missing or malformed header, an unknown key or a disabled key.
        """
        if not self.enabled:
            return None
        key = _bearer(authorization)
        if key is None:
            self._count("missing")
            raise invalid_api_key(MISSING_KEY_MESSAGE)
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        found: _Key | None = None
        for entry in self._buckets.get(digest[:_BUCKET_BYTES], ()):
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        if found is None:
            self._count("incorrect")
            raise invalid_api_key(INCORRECT_KEY_MESSAGE)
        if found.disabled:
            self._count("disabled")
            raise invalid_api_key(DISABLED_KEY_MESSAGE)
        return found.principal

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.auth_failures.labels(reason=reason).inc()


def check_model(principal: Principal | None, model: str) -> None:
    """Raise 404 when the tenant may not see `model`, 403 when this key may not use it."""
    if principal is None:
        return
    if not principal.may_see(model):
        raise model_not_found(model)
    if not principal.may_use(model):
        raise APIError(
            403,
            f"This API key is not allowed to use the model '{model}'.",
            param="model",
            code="model_not_allowed",
        )


def _bearer(authorization: str | None) -> str | None:
    """The key of `Bearer KEY` (scheme case-insensitive), None when absent or malformed."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return None
    return key
