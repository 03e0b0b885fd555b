"""Child processes that die with their launcher (`--parent-pid` of `homing sim` and
`homing worker`)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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
