"""`[router]` retry and migration keys: their defaults, the policy they make, and strict
types and ranges reported with the key's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.config import ConfigError, load_config
from homing.gateway.retry_budget import RetryPolicy


def test_retries_default_to_one_within_a_fifth_of_requests_and_no_migration() -> None:
    """No file: one retry per request, budget 0.2 of requests plus 3/s over 10 s, streams
    not migrated."""
    router = load_config(None).router
    assert (router.max_retries, router.retry_budget_ratio) == (2, 0.2)
    assert (router.retry_min_per_s, router.retry_window_s) == (3.0, 10.0)
    assert router.migrate_streams is False
    assert RetryPolicy.from_router(router) == RetryPolicy()


def test_retry_keys_from_a_file_make_the_policy(tmp_path: Path) -> None:
    """A `[router]` section's retry keys reach the policy and the migration switch."""
    path = tmp_path / "c.toml"
    path.write_text(
        "[router]\nmax_retries = 2\nretry_budget_ratio = 0.5\nretry_min_per_s = 1\n"
        "retry_window_s = 30\nmigrate_streams = true\n"
    )
    router = load_config(path).router
    assert RetryPolicy.from_router(router) == RetryPolicy(
        max_retries=2, ratio=0.5, min_retries_per_s=1.0, window_s=30.0
    )
    assert router.migrate_streams is True


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ('max_retries = "1"', "max_retries"),
        ("max_retries = 1.0", "max_retries"),
        ("max_retries = -1", "max_retries"),
        ("max_retries = true", "max_retries"),
        ("retry_budget_ratio = 1.5", "retry_budget_ratio"),
        ("retry_budget_ratio = -0.1", "retry_budget_ratio"),
        ('retry_budget_ratio = "0.2"', "retry_budget_ratio"),
        ("retry_budget_ratio = nan", "retry_budget_ratio"),
        ("retry_min_per_s = -1", "retry_min_per_s"),
        ("retry_min_per_s = inf", "retry_min_per_s"),
        ("retry_window_s = 0.5", "retry_window_s"),
        ("retry_window_s = 61", "retry_window_s"),
        ("migrate_streams = 1", "migrate_streams"),
        ('migrate_streams = "true"', "migrate_streams"),
    ],
)
def test_a_bad_retry_setting_is_an_error_naming_the_key(
    tmp_path: Path, line: str, key: str
) -> None:
    """Wrong types (strings, floats for counts, numbers for the switch) and values out of
    range are refused with `router.<key>` in the message."""
    path = tmp_path / "c.toml"
    path.write_text(f"[router]\n{line}\n")
    with pytest.raises(ConfigError, match=rf"router\.{key}"):
        load_config(path)
