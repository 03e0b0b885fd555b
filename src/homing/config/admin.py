"""The admin API (`[admin]`): its listeners and keys, and homing's state directory."""

from __future__ import annotations

import os

from pydantic import Field, field_validator, model_validator

from homing.config.base import Section


class AdminSettings(Section):
    """The admin API (`homing.v1.Admin`) and its listener.

    `socket`: a Unix socket path (default `state_dir/admin.sock`; mode 0600); "" turns the
    socket off. `host` and `port`: a TCP listener as well (port None: none), which needs
    `keys`. `keys`: admin keys as SHA-256 hex digests (`printf %s "$KEY" | sha256sum`),
    separate from tenant keys; with none, only the socket's file mode guards the API.
    `state_dir`: where the socket lives (default `$HOMING_STATE_DIR`, else
    `$XDG_RUNTIME_DIR/homing`, else `/tmp/homing-<uid>`). `enabled`: False serves no admin
    API at all.
    """

    enabled: bool = True
    state_dir: str | None = None
    socket: str | None = None
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)
    keys: list[AdminKeySettings] = Field(default_factory=list)

    @model_validator(mode="after")
    def _tcp_needs_keys(self) -> AdminSettings:
        if self.enabled and self.port is not None and not self.keys:
            raise ValueError("an admin TCP listener (admin.port) needs admin.keys")
        return self

    def socket_path(self) -> str | None:
        """The Unix socket to serve (None: no socket)."""
        if not self.enabled or self.socket == "":
            return None
        if self.socket is not None:
            return self.socket
        return os.path.join(default_state_dir(self.state_dir), "admin.sock")


class AdminKeySettings(Section):
    """One admin key: a name for logs and its SHA-256 hex digest (never the key)."""

    id: str = Field(min_length=1, max_length=128)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")

    @field_validator("sha256")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


def default_state_dir(configured: str | None = None) -> str:
    """homing's state directory: `configured`, else `$HOMING_STATE_DIR`, else
    `$XDG_RUNTIME_DIR/homing`, else `/tmp/homing-<uid>`."""
    if configured:
        return configured
    if os.environ.get("HOMING_STATE_DIR"):
        return os.environ["HOMING_STATE_DIR"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "homing")
    return f"/tmp/homing-{os.getuid()}"
