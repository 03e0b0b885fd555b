"""The embedded default: simulated SGLang workers run as child processes on free loopback ports.

Each worker is its own `python -m homing sim --workers 1 --port 0` process (so one can be
killed or restarted alone). A child prints one JSON line `{"event": "ready", "workers": [...]}`
when it serves; its stderr goes to ours. Children die with their parent (`--parent-pid`: the
child sets Linux `PR_SET_PDEATHSIG` itself), and `stop()` sends SIGTERM, then SIGKILL after a
grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass

import structlog

from homing.config import SimSettings

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

    def _argv(self) -> list[str]:
        s = self.settings
        return [
            sys.executable,
            "-m",
            "homing",
            "sim",
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
            await asyncio.wait_for(
                asyncio.gather(*(self._start_one() for _ in range(self.settings.workers))),
                timeout_s,
            )
        except BaseException:
            await self.stop()
            raise
        return [child.url for child in self.children]

    async def _start_one(self) -> None:
        process = await asyncio.create_subprocess_exec(
            *self._argv(),
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        assert process.stdout is not None
        while True:
            line = await process.stdout.readline()
            if not line:
                code = await process.wait()
                raise RuntimeError(f"simulated worker exited with code {code} before it was ready")
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(message, dict) and message.get("event") == "ready":
                url = message["workers"][0]["url"]
                self.children.append(SimProcess(process, url))
                log.info("sim_worker_ready", url=url, pid=process.pid)
                # Keep draining stdout so the child never blocks on a full pipe.
                asyncio.get_running_loop().create_task(_drain(process.stdout))
                return

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every child, SIGKILL those still alive after `grace_s`."""
        children, self.children = self.children, []
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
        for child in children:
            try:
                await asyncio.wait_for(child.process.wait(), grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                await child.process.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass
