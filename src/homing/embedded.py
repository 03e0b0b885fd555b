"""The embedded default: simulated SGLang workers run as child processes on free loopback ports.

Each worker is its own `python -m homing sim --workers 1 --port 0` process (so one can be
killed or restarted alone). A child prints one JSON line `{"event": "ready", "workers": [...]}`
when it serves; its stderr goes to ours. Children die with their parent (`--parent-pid`: the
child sets Linux `PR_SET_PDEATHSIG` itself), and `stop()` sends SIGTERM, then SIGKILL after a
grace period.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import structlog

from homing.config import SimSettings
from homing.sim.process import spawn_sim, terminate

log = structlog.get_logger("homing.embedded")


@dataclass
class SimProcess:
    """One child process hosting one simulated worker."""

    process: asyncio.subprocess.Process
    url: str


class SimLauncher:
    """Starts and stops the simulated workers of the embedded default."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.children: list[SimProcess] = []
        self._watchers: set[asyncio.Task[None]] = set()
        self._stopping = False

    def _args(self) -> list[str]:
        s = self.settings
        return [
            "--workers",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model",
            s.model,
            "--gpu",
            s.gpu,
            "--speedup",
            str(s.speedup),
            *(["--tp", str(s.tp)] if s.tp is not None else []),
            "--parent-pid",
            str(os.getpid()),
            *s.extra_args,
        ]

    async def start(self, timeout_s: float = 60.0) -> list[str]:
        """Start `settings.workers` children; the worker URLs (`grpc://127.0.0.1:PORT`).

        Raises `RuntimeError` when a child exits or stays silent past `timeout_s`.
        """
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(self._start_one() for _ in range(self.settings.workers)))
        except BaseException:
            await self.stop()
            raise
        return [child.url for child in self.children]

    async def _start_one(self) -> None:
        process, ready = await spawn_sim(self._args())
        url = ready["workers"][0]["url"]
        self.children.append(SimProcess(process, url))
        log.info("sim_worker_ready", url=url, pid=process.pid)
        watcher = asyncio.get_running_loop().create_task(self._watch(process, url))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, process: asyncio.subprocess.Process, url: str) -> None:
        """Log a child that exits while it should be serving (the pool's health probes take
        it out of rotation; nothing restarts it)."""
        code = await process.wait()
        if not self._stopping:
            log.warning("sim_worker_exited", url=url, pid=process.pid, code=code)

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every child, SIGKILL those still alive after `grace_s`."""
        self._stopping = True
        children, self.children = self.children, []
        await terminate((child.process for child in children), grace_s)
