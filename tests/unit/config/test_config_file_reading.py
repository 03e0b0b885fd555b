"""A configuration file that is not one homing can read is refused with `ConfigError` and
the reason, without blocking, reading without end, or raising anything else: the same
refusal `homing serve` prints at start and a reload logs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from homing.config import MAX_CONFIG_BYTES, ConfigError, load_config


def _refusal(path: Path | str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path)
    return str(err.value)


def test_a_file_that_is_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "homing.toml"
    path.write_bytes(b"[gateway]\nhost = '\xff'\n")
    assert _refusal(path) == f"{path}: not UTF-8 text (byte 18 is invalid)"


@pytest.mark.parametrize(
    "value", ["[" * 5000 + "]" * 5000, "{a = " * 5000 + "1" + "}" * 5000], ids=["array", "table"]
)
def test_deeply_nested_toml_is_refused_not_a_recursion_error(tmp_path: Path, value: str) -> None:
    path = tmp_path / "homing.toml"
    path.write_text(f"x = {value}\n")
    assert _refusal(path) == f"{path}: nested too deeply to read"


def test_deep_nesting_is_refused_in_a_thread_too(tmp_path: Path) -> None:
    """The daemon reads a reload's file in a thread (a smaller stack than the main one)."""
    path = tmp_path / "homing.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    seen: list[str] = []
    thread = threading.Thread(target=lambda: seen.append(_refusal(path)))
    thread.start()
    thread.join(30)
    assert seen == [f"{path}: nested too deeply to read"]


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "homing.toml"
    with path.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    assert _refusal(path) == f"{path}: larger than 4 MiB"
    path.write_text("# " + "x" * (MAX_CONFIG_BYTES - 3) + "\n")  # exactly at the cap: read
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert load_config(path).gateway.port == 8080


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "homing.toml"
    os.mkfifo(path)
    assert _refusal(path) == f"{path}: not a regular file (a FIFO)"


@pytest.mark.parametrize(
    ("target", "kind"), [("/dev/zero", "a character device"), ("/", "a directory")]
)
def test_a_device_or_directory_is_refused(tmp_path: Path, target: str, kind: str) -> None:
    path = tmp_path / "homing.toml"
    path.symlink_to(target)  # a symlink to a regular file is read as that file
    assert _refusal(path) == f"{path}: not a regular file ({kind})"


def test_a_missing_file_names_the_path_and_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert _refusal(path) == f"{path}: No such file or directory"


def test_an_integer_of_too_many_digits_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "homing.toml"
    path.write_text("[gateway]\nport = " + "1" * 5000 + "\n")
    assert _refusal(path) == (
        f"{path}: Exceeds the limit (4300 digits) for integer string conversion: "
        "value has 5000 digits"
    )


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    """Kubernetes ConfigMaps and /etc alternatives are symlinks."""
    real = tmp_path / "real.toml"
    real.write_text("[gateway]\nport = 9999\n")
    link = tmp_path / "homing.toml"
    link.symlink_to(real)
    assert load_config(link).gateway.port == 9999
