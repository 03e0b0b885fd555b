"""API keys: found by their SHA-256 only, several per tenant, disabled ones refused, OpenAI's
401/403/404 bodies, and no authentication at all when no tenant is configured."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from homing.config import HomingConfig, TenantSettings
from homing.gateway.auth import KeyRing, check_model, hash_key
from homing.gateway.errors import APIError
from homing.gateway.metrics import GatewayMetrics


def tenant(name: str, *keys: dict[str, Any], **fields: Any) -> TenantSettings:
    return TenantSettings.model_validate({"name": name, "keys": list(keys), **fields})


def key(key_id: str, secret: str, **fields: Any) -> dict[str, Any]:
    return {"id": key_id, "sha256": hash_key(secret), **fields}


RING = KeyRing(
    [
        tenant("acme", key("acme-prod", "sk-prod"), key("acme-ci", "sk-ci"), models=["m1", "m2"]),
        tenant(
            "globex",
            key("globex-old", "sk-old", disabled=True),
            key("globex-new", "sk-new", models=["m1"]),
            priority=3,
        ),
    ]
)


def _401(message: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


def test_every_key_of_a_tenant_authenticates_as_that_tenant() -> None:
    """Two keys of one tenant both resolve to it, each with its own key id."""
    prod = RING.authenticate("Bearer sk-prod")
    ci = RING.authenticate("bearer   sk-ci ")
    assert prod is not None and ci is not None
    assert (prod.tenant, prod.key_id) == ("acme", "acme-prod")
    assert (ci.tenant, ci.key_id) == ("acme", "acme-ci")


def test_missing_header_is_401_invalid_api_key() -> None:
    """No Authorization header gets OpenAI's 'You didn't provide an API key' 401."""
    with pytest.raises(APIError) as caught:
        RING.authenticate(None)
    assert caught.value.status == 401
    assert caught.value.body() == _401(
        "You didn't provide an API key. You need to provide your API key in an Authorization "
        "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
    )


@pytest.mark.parametrize("header", ["sk-prod", "Basic sk-prod", "Bearer", "Bearer  "])
def test_header_without_a_bearer_key_is_treated_as_missing(header: str) -> None:
    """A value that is not `Bearer KEY` is a missing key, not a lookup."""
    with pytest.raises(APIError) as caught:
        RING.authenticate(header)
    assert caught.value.body()["error"]["message"].startswith("You didn't provide an API key")


def test_unknown_key_is_401_without_echoing_the_key() -> None:
    """A wrong key gets 401 `invalid_api_key` and the message does not contain the key."""
    with pytest.raises(APIError) as caught:
        RING.authenticate("Bearer sk-wrong-secret")
    assert caught.value.body() == _401("Incorrect API key provided.")
    assert "sk-wrong-secret" not in str(caught.value.body())


def test_disabled_key_is_refused_while_the_tenants_other_key_works() -> None:
    """A disabled key gets 401; another key of the same tenant still authenticates."""
    with pytest.raises(APIError) as caught:
        RING.authenticate("Bearer sk-old")
    assert caught.value.body() == _401("The API key provided has been disabled.")
    principal = RING.authenticate("Bearer sk-new")
    assert principal is not None and principal.tenant == "globex" and principal.priority == 3


def test_failures_are_counted_by_reason() -> None:
    """Each refusal increments `homing_auth_failures_total` with its reason."""
    metrics = GatewayMetrics()
    ring = KeyRing([tenant("a", key("a1", "sk-a"), key("a2", "sk-b", disabled=True))], metrics)
    for header in (None, "Bearer nope", "Bearer sk-b", "Bearer nope"):
        with pytest.raises(APIError):
            ring.authenticate(header)
    assert metrics.value("homing_auth_failures_total", reason="missing") == 1
    assert metrics.value("homing_auth_failures_total", reason="incorrect") == 2
    assert metrics.value("homing_auth_failures_total", reason="disabled") == 1


def test_without_tenants_authentication_is_off() -> None:
    """The embedded default has no tenants: any or no header passes, as nobody."""
    ring = KeyRing(HomingConfig().tenants)
    assert not ring.enabled
    assert ring.authenticate(None) is None
    assert ring.authenticate("Bearer anything") is None
    check_model(None, "any-model")


def test_model_outside_the_tenants_list_is_404_like_a_missing_model() -> None:
    """A model the tenant may not use gets the same 404 body as one that does not exist."""
    principal = RING.authenticate("Bearer sk-prod")
    with pytest.raises(APIError) as caught:
        check_model(principal, "m3")
    assert caught.value.status == 404
    assert caught.value.body() == {
        "error": {
            "message": "The model 'm3' does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_model_the_key_may_not_use_is_403() -> None:
    """A key restricted to m1 gets 403 `model_not_allowed` for a model its tenant has."""
    principal = RING.authenticate("Bearer sk-new")
    check_model(principal, "m1")
    with pytest.raises(APIError) as caught:
        check_model(principal, "m2")
    assert caught.value.status == 403
    assert caught.value.body() == {
        "error": {
            "message": "This API key is not allowed to use the model 'm2'.",
            "type": "permission_error",
            "param": "model",
            "code": "model_not_allowed",
        }
    }


def test_config_rejects_a_plain_key_and_duplicate_hashes() -> None:
    """Only 64-hex SHA-256 digests are accepted, and one digest cannot name two keys."""
    with pytest.raises(ValidationError):
        HomingConfig.model_validate(
            {"tenants": [{"name": "a", "keys": [{"id": "k", "sha256": "sk-plain-key"}]}]}
        )
    digest = hash_key("sk-same")
    with pytest.raises(ValidationError, match="same hash"):
        HomingConfig.model_validate(
            {
                "tenants": [
                    {"name": "a", "keys": [{"id": "k1", "sha256": digest}]},
                    {"name": "b", "keys": [{"id": "k2", "sha256": digest.upper()}]},
                ]
            }
        )
