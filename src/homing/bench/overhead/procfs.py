"""CPU time and memory of processes, and this machine's description, for `make
bench-overhead`: read from Linux's per-process CPU clocks and /proc.

Rule of this file: reads only; no asyncio, no subprocess.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time of process `pid`, all its threads, exited ones included (s, ns resolution):
    Linux's CPU-time clock of that process (clock id `(~pid << 3) | 2`, CPUCLOCK_SCHED of
    MAKE_PROCESS_CPUCLOCK in linux/posix-timers.h), the utime + stime that /proc/PID/stat
    counts in 10 ms ticks (`stat_cpu_seconds`). Falls back to those ticks where the clock
    cannot be read."""
    try:
        return time.clock_gettime_ns((~pid << 3) | 2) / 1e9
    except OSError:
        return stat_cpu_seconds(pid)


def children(pid: int) -> list[int]:
    """The live children of process `pid` (/proc/PID/task/PID/children); [] once gone."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def stat_cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, all its threads (s, in clock ticks of 1 / CLK_TCK):
    fields 14 and 15 of /proc/PID/stat, counted after the parenthesised command name."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mib(pid: int) -> float:
    """VmHWM of process `pid` (MiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def machine() -> dict[str, Any]:
    """platform, /proc/cpuinfo model name and core count of this machine."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"platform": platform.platform(), "cpu_model": model, "cores": os.cpu_count()}
