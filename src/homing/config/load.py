"""Reading a configuration file: a bounded, regular, UTF-8 TOML file into `HomingConfig`."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

from pydantic import ValidationError

from homing.config.root import HomingConfig


class ConfigError(Exception):
    """A configuration file that cannot be read or does not validate."""


#: The largest configuration file read, bytes (a bigger one is refused unread).
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_config_text(path: str | Path) -> str:
    """The text of the configuration file at `path`: a regular file of at most
    `MAX_CONFIG_BYTES`, UTF-8. Never blocks on a FIFO or reads an endless device. Raises
    `ConfigError` ("PATH: why") otherwise, or when it cannot be opened or read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{path}: not a regular file ({_file_kind(mode)})")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES and (chunk := os.read(fd, MAX_CONFIG_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from err
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start} is invalid)") from None


def _file_kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a file")


def load_config(path: str | Path | None) -> HomingConfig:
    """Read a TOML file (`read_config_text`) into `HomingConfig`; `None` gives the embedded
    default.

    Raises `ConfigError` with the file name and the first problem found: unreadable, not a
    regular file, over `MAX_CONFIG_BYTES`, not UTF-8, not TOML, nested too deeply, invalid.
    """
    if path is None:
        return HomingConfig()
    text = read_config_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: {err}") from err
    except ValueError as err:  # an integer of more digits than Python converts
        raise ConfigError(f"{path}: {str(err).partition(';')[0]}") from err
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read") from None
    try:
        return HomingConfig.model_validate(data)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read") from None
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        if not where:  # a rule across sections: its message names them
            raise ConfigError(f"{path}: {first['msg'].removeprefix('Value error, ')}") from err
        raise ConfigError(f"{path}: {where}: {first['msg']}") from err
