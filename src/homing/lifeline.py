"""Child processes that die with their launcher (`--parent-pid` of `homing sim` and
`homing worker`), and that never inherit systemd's hold on the service (`child_environ`:
they would otherwise notify systemd, or take its sockets, as if they were the service)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Mapping

from homing import GRPC_EXPERIMENTS_ENV, GRPC_EXPERIMENTS_INHERITED

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

#: What systemd sets for the service's main process alone (sd_notify(3), sd_listen_fds(3),
#: sd_watchdog_enabled(3)); never passed on to a child.
SERVICE_VARIABLES = frozenset(
    {
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
    }
)


def child_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `environ` without `SERVICE_VARIABLES`: the environment for a child process.
    By default `os.environ`, with `GRPC_EXPERIMENTS` as this process found it: homing's own
    default (`homing.GRPC_EXPERIMENTS_DEFAULT`) is for homing's processes, which set it
    themselves; an engine it starts keeps gRPC's defaults or the operator's."""
    if environ is not None:
        return {k: v for k, v in environ.items() if k not in SERVICE_VARIABLES}
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARIABLES}
    env.pop(GRPC_EXPERIMENTS_ENV, None)
    if GRPC_EXPERIMENTS_INHERITED is not None:
        env[GRPC_EXPERIMENTS_ENV] = GRPC_EXPERIMENTS_INHERITED
    return env


def exit_with_parent(parent_pid: int) -> bool:
    """Ask Linux to SIGTERM us when our parent exits; False if it has already gone.

    Set here, after exec, rather than in the launcher's `preexec_fn`: running Python between
    fork and exec in a process with live gRPC threads can abort the child. Elsewhere than
    Linux nothing is set and only the parent check is made.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    return os.getppid() == parent_pid


#: Run before a child's real command, in its process (`python -c LIFELINE PARENT_PID PROGRAM
#: ARGS...`): ask Linux to SIGTERM it when its parent (us) dies (PR_SET_PDEATHSIG = 1, kept
#: across exec), exit if the parent is already gone, then exec the command (PROGRAM is an
#: absolute path). A SIGKILLed parent so leaves no engine behind. Done in the child rather
#: than in a `preexec_fn`, which runs Python between fork and exec.
LIFELINE = (
    "import contextlib, ctypes, os, signal, sys\n"
    "with contextlib.suppress(OSError, AttributeError):\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
