"""[daemon] takes only what it can use, with the reason named."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "min_ready_workers = 0",
            "daemon.min_ready_workers: Input should be greater than or equal to 1",
        ),
        ('min_ready_workers = "2"', "daemon.min_ready_workers: Input should be a valid integer"),
        (
            "stall_threshold_s = -1",
            "daemon.stall_threshold_s: Input should be greater than or equal to 0",
        ),
        ("status_interval_s = 0", "daemon.status_interval_s: Input should be greater than 0"),
        ("status_interval_s = nan", "daemon.status_interval_s: Input should be a finite number"),
        ("notify = true", "daemon.notify: Extra inputs are not permitted"),
    ],
)
def test_a_bad_daemon_setting_is_refused_by_name(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "homing.toml"
    path.write_text(f"[daemon]\n{body}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {message}"


def test_the_daemon_defaults_are_one_ready_worker_a_one_second_stall_and_five_second_status(
    tmp_path: Path,
) -> None:
    daemon = load_config(None).daemon
    assert (daemon.min_ready_workers, daemon.stall_threshold_s, daemon.status_interval_s) == (
        1,
        1.0,
        5.0,
    )
