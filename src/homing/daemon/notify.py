"""The sd_notify datagram protocol (sd_notify(3)), as a small module of our own.

Rule of the file: no I/O but one `sendto` per message on one datagram socket; a manager
that is gone or a full socket buffer is logged and never raised, because a notification is
never worth failing the service for.

`NOTIFY_SOCKET` names an `AF_UNIX` datagram socket: a path, or an abstract socket written
with a leading "@" (sent with a leading NUL byte). A message is newline-separated
`KEY=VALUE` assignments (READY=1, RELOADING=1, STOPPING=1, STATUS=..., WATCHDOG=1,
MONOTONIC_USEC=...); a value's control characters (newlines included) are sent as spaces
and it is cut at `MAX_VALUE_CHARS`. Without `NOTIFY_SOCKET` every send is a no-op.

The processes homing starts get none of systemd's variables (`homing.lifeline.child_environ`).

Why our own: the pure-Python `sdnotify` package has had no release since 2017 and hides
send errors; `cysystemd` and `systemd-python` compile against libsystemd's headers, which a
fresh machine lacks. The protocol is one `sendto`.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("homing.daemon")

#: The longest value a message carries (a longer one, e.g. a long refusal, is cut there).
MAX_VALUE_CHARS = 2048

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def socket_address(value: str) -> str | bytes:
    """The address `NOTIFY_SOCKET=value` names: a path as given, "@name" as the abstract
    address b"\\0name". ValueError for anything else (sd_notify accepts only these)."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    raise ValueError(f"NOTIFY_SOCKET={value!r} is neither an absolute path nor @abstract")


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC now in microseconds, as `MONOTONIC_USEC=` wants it with RELOADING=1."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def one_line(value: object) -> str:
    """`str(value)` with each control character (newline, tab, NUL, ...) as a space, cut at
    `MAX_VALUE_CHARS` (the cut marked with "...")."""
    text = _CONTROL.sub(" ", str(value))
    if len(text) > MAX_VALUE_CHARS:
        text = text[: MAX_VALUE_CHARS - 3] + "..."
    return text


def format_message(fields: Mapping[str, object]) -> bytes:
    """`KEY=VALUE` lines in the given order, each value `one_line`, as UTF-8 (a character
    UTF-8 cannot carry, such as a lone surrogate, sent as "?")."""
    lines = [f"{key}={one_line(value)}" for key, value in fields.items()]
    return "\n".join(lines).encode("utf-8", errors="replace")


class Notifier:
    """Sends sd_notify messages to the manager named by `environ["NOTIFY_SOCKET"]`.

    `enabled` is False (every call a no-op) without it, or with a value that names no
    socket (logged). `close()` releases the socket.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address: str | bytes | None = None
        self._sock: socket.socket | None = None
        value = env.get("NOTIFY_SOCKET")
        if not value:
            return
        try:
            self._address = socket_address(value)
        except ValueError as err:
            log.warning("notify_socket_invalid", error=str(err))
            return
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere."""
        return self._sock is not None

    def send(self, **fields: object) -> bool:
        """Send one message of `fields` (in order); True when it was handed to the socket.
        Never raises: a failure is logged (`notify_failed`) and gives False."""
        if self._sock is None or self._address is None:
            return False
        try:
            self._sock.sendto(format_message(fields), self._address)
        except Exception as err:  # a notification never fails the service
            log.warning(
                "notify_failed", error=str(err) or type(err).__name__, fields=sorted(fields)
            )
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """READY=1, with a STATUS line when given."""
        return self.send(READY=1, **({"STATUS": status} if status else {}))

    def reloading(self) -> bool:
        """RELOADING=1 with MONOTONIC_USEC (systemd 253's reload handshake)."""
        return self.send(RELOADING=1, MONOTONIC_USEC=monotonic_usec())

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1, with a STATUS line when given."""
        return self.send(STOPPING=1, **({"STATUS": status} if status else {}))

    def status(self, text: str) -> bool:
        """A STATUS= line for `systemctl status`."""
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        """WATCHDOG=1: the service is alive."""
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        """Release the socket (further sends are no-ops)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
