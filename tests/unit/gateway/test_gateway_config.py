"""The gateway's config sections: defaults are the embedded ones (auth off, in-process
quotas, fail closed), and inconsistent settings are refused when the file loads."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from homing.config import AdmissionSettings, GatewaySettings, HomingConfig


def test_embedded_default_has_no_tenants_and_fails_closed() -> None:
    """No tenants (auth off), the memory backend, and 503 on a store error."""
    config = HomingConfig()
    assert config.tenants == []
    assert config.quotas.backend == "memory"
    assert config.quotas.on_store_error == "fail_closed"
    assert config.quotas.window_s == 60.0


def test_half_a_tls_pair_is_refused() -> None:
    """A certificate without its key (or the reverse) is a config error."""
    with pytest.raises(ValidationError, match="set together"):
        GatewaySettings(tls_cert_file="cert.pem")
    with pytest.raises(ValidationError, match="set together"):
        GatewaySettings(tls_key_file="key.pem")


def test_one_tenant_cannot_be_given_more_than_the_whole_queue() -> None:
    """`max_queued_per_tenant` above `max_queued` is refused; by default it is a quarter."""
    with pytest.raises(ValidationError, match="must not exceed"):
        AdmissionSettings(max_queued=4, max_queued_per_tenant=5)
    assert AdmissionSettings(max_queued=8).tenant_cap == 2
    assert AdmissionSettings(max_queued=2).tenant_cap == 1


def test_unknown_quota_key_is_an_error() -> None:
    """A typo in a tenant's quota is reported, not ignored."""
    with pytest.raises(ValidationError, match="request_per_minute"):
        HomingConfig.model_validate(
            {
                "tenants": [
                    {
                        "name": "a",
                        "keys": [{"id": "k", "sha256": "0" * 64}],
                        "quota": {"request_per_minute": 5},
                    }
                ]
            }
        )
