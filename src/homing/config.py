"""Typed configuration: a TOML file read into pydantic models; every default is the embedded one.

With no file, `homing serve` runs the embedded default: simulated workers started as child
processes (`sim`), the gateway on 127.0.0.1:8080 (HTTP) and 127.0.0.1:50051 (gRPC).
A file that lists `engines.workers` (`grpc://host:port`) serves those SGLang workers instead.
Unknown keys are errors, so a typo in a config file is reported rather than ignored.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GatewaySettings(_Section):
    """HTTP and gRPC listeners and request limits."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    request_timeout_s: float = Field(default=600.0, gt=0)
    drain_timeout_s: float = Field(default=30.0, ge=0)


class RouterSettings(_Section):
    """Routing policy for the model's pool."""

    policy: Literal["cache_aware", "round_robin", "least_load"] = "cache_aware"
    block_size: int = Field(default=16, ge=1)


class EngineSettings(_Section):
    """The SGLang workers to serve (empty = start simulated ones) and how to probe them."""

    workers: list[str] = Field(default_factory=list)
    tokenizer_path: str | None = None
    startup_timeout_s: float = Field(default=120.0, gt=0)
    health_interval_s: float = Field(default=1.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)
    unhealthy_threshold: int = Field(default=3, ge=1)
    healthy_threshold: int = Field(default=2, ge=1)

    @field_validator("workers")
    @classmethod
    def _grpc_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith("grpc://") or ":" not in url.removeprefix("grpc://"):
                raise ValueError(f"worker {url!r} must look like grpc://host:port")
        return urls


class SimSettings(_Section):
    """The embedded default: simulated SGLang workers started as child processes."""

    workers: int = Field(default=2, ge=1, le=64)
    model: str = "llama-3.1-8b"
    gpu: str = "H100"
    tp: int | None = Field(default=None, ge=1)  # None: the preset's TP (8 for 70b)
    speedup: float = Field(default=1.0, gt=0)
    extra_args: list[str] = Field(default_factory=list)


class HomingConfig(_Section):
    """The whole configuration of one `homing serve` process."""

    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    engines: EngineSettings = Field(default_factory=EngineSettings)
    sim: SimSettings = Field(default_factory=SimSettings)

    @property
    def embedded(self) -> bool:
        """True when no workers are configured, so simulated ones are started."""
        return not self.engines.workers


class ConfigError(Exception):
    """A configuration file that cannot be read or does not validate."""


def load_config(path: str | Path | None) -> HomingConfig:
    """Read a TOML file into `HomingConfig`; `None` gives the embedded default.

    Raises `ConfigError` with the file name and the first problem found.
    """
    if path is None:
        return HomingConfig()
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: {err}") from err
    try:
        return HomingConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from err
