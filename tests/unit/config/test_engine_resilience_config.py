"""`[engines.outliers]`, `[engines.breaker]` and `engines.progress_window_s`: on by default,
strict types, every mistake reported with its location."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.config import ConfigError, load_config
from homing.engines.breaker import BreakerConfig
from homing.engines.outliers import OutlierConfig


def test_defaults_are_on_and_match_the_policies_own() -> None:
    """The sections' defaults are the pure policies' defaults (one source of numbers)."""
    engines = load_config(None).engines
    assert engines.outliers.enabled and engines.breaker.enabled
    assert OutlierConfig(**engines.outliers.model_dump(exclude={"enabled"})) == OutlierConfig()
    assert BreakerConfig(**engines.breaker.model_dump()) == BreakerConfig()
    assert engines.progress_window_s == 5.0


def test_a_file_sets_them(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[engines]\nprogress_window_s = 2\n"
        "[engines.outliers]\ninterval_s = 1\nwindow_s = 3\nconsecutive = 3\n"
        "[engines.breaker]\nenabled = false\n"
    )
    engines = load_config(path).engines
    assert (engines.outliers.interval_s, engines.outliers.window_s) == (1.0, 3.0)
    assert engines.outliers.consecutive == 3
    assert not engines.breaker.enabled
    assert engines.progress_window_s == 2.0


@pytest.mark.parametrize(
    ("section", "line", "message"),
    [
        ("outliers", "factor = 1", r"outliers\.factor: Input should be greater than 1"),
        ("outliers", 'interval_s = "5"', r"outliers\.interval_s: Input should be a valid number"),
        ("outliers", "enabled = 1", r"outliers\.enabled: Input should be a valid boolean"),
        ("outliers", "consecutive = 2.5", r"outliers\.consecutive: Input should be a valid int"),
        ("outliers", "max_ejected_fraction = 2", r"outliers\.max_ejected_fraction: Input should"),
        ("outliers", "base_ejection_s = 600", r"outliers: Value error, max_ejection_s must be at"),
        ("outliers", "window_s = 120", r"outliers: Value error, window_s must be at most 60"),
        ("outliers", "window_s = inf", r"outliers\.window_s: Input should be a finite number"),
        ("outliers", "ejection_s = 5", r"outliers\.ejection_s: Extra inputs are not permitted"),
        ("breaker", "consecutive = 0", r"breaker\.consecutive: Input should be greater than or"),
        ("breaker", "open_s = 60", r"breaker: Value error, max_open_s must be at least open_s"),
        ("breaker", "open_s = -1", r"breaker\.open_s: Input should be greater than 0"),
    ],
)
def test_mistakes_are_errors_naming_the_key(
    tmp_path: Path, section: str, line: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[engines.{section}]\n{line}\n")
    with pytest.raises(ConfigError, match=rf"c\.toml: engines\.{message}"):
        load_config(path)


def test_progress_window_must_be_positive(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[engines]\nprogress_window_s = 0\n")
    with pytest.raises(ConfigError, match=r"engines\.progress_window_s: Input should be greater"):
        load_config(path)
