"""SIGHUP before the event loop's handler is set: remembered, never fatal.

Python starts with SIGHUP's default action, which ends the process; `homing serve` needs
about half a second of imports before `Daemon.run` sets the loop's handler. `hold_sighup`,
called first thing, turns a SIGHUP in that window into a pending reload that the daemon
takes over (`take_pending_sighup`) once its own handler is in place. Light on purpose: it
imports nothing of homing.
"""

from __future__ import annotations

import signal
from types import FrameType

_pending = False


def _remember(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True


def hold_sighup() -> None:
    """From now on a SIGHUP is remembered instead of ending the process."""
    signal.signal(signal.SIGHUP, _remember)


def take_pending_sighup() -> bool:
    """Whether a SIGHUP came since `hold_sighup` (or the last call); clears it."""
    global _pending
    was, _pending = _pending, False
    return was
