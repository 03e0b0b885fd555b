"""Sockets handed over by systemd socket activation (sd_listen_fds(3)).

systemd passes `LISTEN_FDS` descriptors starting at fd 3 to the process `LISTEN_PID`, named
by `LISTEN_FDNAMES` (colon-separated, from each socket's `FileDescriptorName=`; "unknown"
when unnamed). The service keeps listening on them across its restarts, so connections that
arrive in between wait in the kernel's backlog instead of being refused.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping

#: The first descriptor systemd passes (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3


class ActivationError(ValueError):
    """The LISTEN_* variables are malformed or name a socket homing cannot use."""


def listen_sockets(
    environ: MutableMapping[str, str] | None = None, pid: int | None = None
) -> dict[str, socket.socket]:
    """The handed-over listening sockets by name ("http" when a single one is unnamed),
    and removes the LISTEN_* variables from `environ` (default `os.environ`) so child
    processes do not take them. Empty when the variables are absent or meant for another
    process. ActivationError for a malformed count, a duplicate name, or a descriptor that
    is not a listening stream socket."""
    env = os.environ if environ is None else environ
    owner = env.get("LISTEN_PID")
    count = env.get("LISTEN_FDS")
    names = env.get("LISTEN_FDNAMES")
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(key, None)
    if not count or owner is None or owner.strip() != str(os.getpid() if pid is None else pid):
        return {}
    if not count.isdigit():
        raise ActivationError(f"LISTEN_FDS={count!r} is not a count")
    n = int(count)
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
        sock = socket.socket(fileno=fd)
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        ):
            sock.detach()
            raise ActivationError(f"descriptor {fd} ({name}) is not a listening stream socket")
        os.set_inheritable(fd, False)
        sock.setblocking(False)
        found[name] = sock
    return found


def check_names(sockets: Mapping[str, socket.socket], known: set[str]) -> None:
    """ActivationError naming any handed-over socket homing has no listener for."""
    unknown = sorted(set(sockets) - known)
    if unknown:
        raise ActivationError(
            f"socket activation passed {', '.join(unknown)}; homing listens on "
            f"{', '.join(sorted(known))} (FileDescriptorName=)"
        )
