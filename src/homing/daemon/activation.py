"""Sockets handed over by systemd socket activation (sd_listen_fds(3)).

systemd passes `LISTEN_FDS` descriptors starting at fd 3 to the process `LISTEN_PID`, named
by `LISTEN_FDNAMES` (colon-separated, from each socket's `FileDescriptorName=`; "unknown"
when unnamed). The service keeps listening on them across its restarts, so connections that
arrive in between wait in the kernel's backlog instead of being refused.

Malformed variables meant for this process are refused (`ActivationError`, `homing serve`
exits 2) rather than ignored as sd_listen_fds(3) does: ignoring them would listen on the
configured address instead of the one the unit hands over. Only TCP listening sockets
(AF_INET or AF_INET6, SOCK_STREAM) are taken; at most `MAX_LISTEN_FDS` of them.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, MutableMapping

#: The first descriptor systemd passes (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3

#: The most sockets homing takes over (it serves one, "http"; more is a unit's mistake).
MAX_LISTEN_FDS = 64

_DECIMAL = re.compile(r"[0-9]{1,19}")  # ASCII digits only: "١٢".isdigit() is True too


class ActivationError(ValueError):
    """The LISTEN_* variables are malformed or name a socket homing cannot use."""


def listen_sockets(
    environ: MutableMapping[str, str] | None = None, pid: int | None = None
) -> dict[str, socket.socket]:
    """The handed-over listening sockets by name ("http" when a single one is unnamed),
    and removes the LISTEN_* variables from `environ` (default `os.environ`) so child
    processes do not take them. Empty when the variables are absent or meant for another
    process. ActivationError for a count or process id that is not ASCII decimal, more than
    `MAX_LISTEN_FDS` sockets, a duplicate name, or a descriptor that is not an open TCP
    listening socket (the message names the descriptor and what it is)."""
    env = os.environ if environ is None else environ
    owner = env.get("LISTEN_PID")
    count = env.get("LISTEN_FDS")
    names = env.get("LISTEN_FDNAMES")
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(key, None)
    if not count or owner is None:
        return {}
    if not _DECIMAL.fullmatch(owner):
        raise ActivationError(f"LISTEN_PID={owner[:64]!r} is not a process id")
    if int(owner) != (os.getpid() if pid is None else pid):
        return {}
    if not _DECIMAL.fullmatch(count):
        raise ActivationError(f"LISTEN_FDS={count[:64]!r} is not a count")
    n = int(count)
    if n > MAX_LISTEN_FDS:
        raise ActivationError(f"LISTEN_FDS={n} is more than {MAX_LISTEN_FDS} sockets")
    labels = names.split(":") if names else []
    if labels and len(labels) != n:
        raise ActivationError(f"LISTEN_FDNAMES names {len(labels)} sockets, LISTEN_FDS {n}")
    if not labels:
        labels = ["http"] if n == 1 else [f"fd{LISTEN_FDS_START + i}" for i in range(n)]
    found: dict[str, socket.socket] = {}
    for i, label in enumerate(labels):
        fd = LISTEN_FDS_START + i
        name = "http" if label == "unknown" and n == 1 else label
        if name in found:
            raise ActivationError(f"two handed-over sockets are named {name!r}")
        _check_listener(fd, name)
        sock = socket.socket(fileno=fd)
        os.set_inheritable(fd, False)
        sock.setblocking(False)
        found[name] = sock
    return found


def _check_listener(fd: int, name: str) -> None:
    """ActivationError unless descriptor `fd` is an open TCP listening socket (AF_INET or
    AF_INET6); the descriptor stays open either way."""
    what = f"descriptor {fd} ({name})"
    try:
        sock = socket.socket(fileno=fd)
    except OSError as err:
        raise ActivationError(f"{what} is not a socket: {err.strerror or err}") from None
    try:
        family, kind, proto = sock.family, sock.type, sock.proto
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    finally:
        sock.detach()
    if family not in (socket.AF_INET, socket.AF_INET6):
        shown = getattr(family, "name", str(family))
        raise ActivationError(
            f"{what} is an {shown} socket; homing takes over only TCP sockets "
            "(AF_INET or AF_INET6, ListenStream=HOST:PORT)"
        )
    if kind != socket.SOCK_STREAM or proto not in (0, socket.IPPROTO_TCP) or not listening:
        raise ActivationError(f"{what} is not a listening TCP stream socket")


def check_names(sockets: Mapping[str, socket.socket], known: set[str]) -> None:
    """ActivationError naming any handed-over socket homing has no listener for."""
    unknown = sorted(set(sockets) - known)
    if unknown:
        raise ActivationError(
            f"socket activation passed {', '.join(unknown)}; homing listens on "
            f"{', '.join(sorted(known))} (FileDescriptorName=)"
        )
