"""The embedded default: homing's own workers run as child processes on free loopback ports.

Simulated workers (`SimLauncher`): each is its own `python -m homing sim --workers 1
--port 0` process (so one can be killed or restarted alone). Real SGLang workers
(`SglangLauncher`): each is its own `python -m homing worker --model PATH --port 0`, which
runs SGLang in a process group of its own. A child prints one JSON line `{"event": "ready",
"workers": [...]}` when it serves; its stderr goes to ours. Children die with their parent
(`--parent-pid`: the child sets Linux `PR_SET_PDEATHSIG` itself), and `stop()` sends
SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import structlog

from homing.aio import gather_or_cancel
from homing.config import SglangSettings, SimSettings
from homing.engines.sglang_launch import kill_group
from homing.sim.process import spawn_homing, terminate

log = structlog.get_logger("homing.embedded")


@dataclass
class WorkerProcess:
    """One child process hosting one worker (simulated, or real SGLang in process group
    `group`)."""

    process: asyncio.subprocess.Process
    url: str
    group: int | None = None
    retired: bool = False  # stopped on purpose (`stop_one`)


class _Launcher:
    """Starts and stops `workers` children of one `homing` sub-command."""

    command = ""  # the `homing` sub-command
    what = ""  # names a child in errors
    event = ""  # prefix of the log events
    kill_grace_s = 0.0  # seconds a child gets after SIGTERM when its start is abandoned

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.children: list[WorkerProcess] = []
        self._watchers: set[asyncio.Task[None]] = set()
        self._stopping = False

    def _args(self) -> list[str]:
        raise NotImplementedError

    async def start(self, timeout_s: float = 60.0) -> list[str]:
        """Start the children, all at once; the worker URLs (`grpc://127.0.0.1:PORT`).

        Raises `RuntimeError` when a child exits before it is ready, `TimeoutError` when
        they are not all ready within `timeout_s`; every child is stopped then.
        """
        try:
            async with asyncio.timeout(timeout_s):
                # A failed start cancels the others (each kills its own child on the way),
                # so none comes up after the stop below.
                return await gather_or_cancel(*(self._start_one() for _ in range(self.workers)))
        except BaseException:
            await self.stop()
            raise

    async def start_one(self, timeout_s: float = 60.0) -> str:
        """Start one more child while the others run; its worker URL once it serves.

        Raises `RuntimeError` when it exits before it is ready, `TimeoutError` after
        `timeout_s` (it is stopped then)."""
        async with asyncio.timeout(timeout_s):
            return await self._start_one()

    async def stop_one(self, url: str, grace_s: float = 5.0) -> None:
        """Stop the child serving `url` (SIGTERM, SIGKILL after `grace_s`); the others go on.
        KeyError for a URL no child serves."""
        child = next((c for c in self.children if c.url == url), None)
        if child is None:
            raise KeyError(url)
        self.children.remove(child)
        child.retired = True
        await terminate([child.process], grace_s)
        if child.group is not None:
            kill_group(child.group)

    async def _start_one(self) -> str:
        process, ready = await spawn_homing(
            self.command, self._args(), what=self.what, kill_grace_s=self.kill_grace_s
        )
        worker = ready["workers"][0]
        url = worker["url"]
        child = WorkerProcess(process, url, worker.get("pid"))
        if self._stopping:  # ready after the stop began: stop it too
            await terminate([process], self.kill_grace_s)
            if child.group is not None:
                kill_group(child.group)
            raise RuntimeError(f"{self.what} came up after the stop began")
        self.children.append(child)
        log.info(f"{self.event}_ready", url=url, pid=process.pid)
        watcher = asyncio.get_running_loop().create_task(self._watch(child))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return url

    async def _watch(self, child: WorkerProcess) -> None:
        """Log a child that exits while it should be serving (the pool's health probes take
        it out of rotation; nothing restarts it)."""
        code = await child.process.wait()
        if not self._stopping and not child.retired:
            log.warning(f"{self.event}_exited", url=child.url, pid=child.process.pid, code=code)

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every child, SIGKILL those still alive after `grace_s`."""
        self._stopping = True
        children, self.children = self.children, []
        await terminate((child.process for child in children), grace_s)


class SimLauncher(_Launcher):
    """Starts and stops the simulated workers of the embedded default."""

    command = "sim"
    what = "simulated worker"
    event = "sim_worker"

    def __init__(self, settings: SimSettings) -> None:
        super().__init__(settings.workers)
        self.settings = settings

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
            *(["--served-model-name", s.served_model_name] if s.served_model_name else []),
            "--parent-pid",
            str(os.getpid()),
            *s.extra_args,
        ]


class SglangLauncher(_Launcher):
    """Starts and stops real SGLang workers (`homing worker` children), one per worker.

    `page_size`: SGLang's KV page size, the router's block size (so its KV events describe
    the router's blocks). A child stops its SGLang within 15 s of SIGTERM
    (`SglangProcess.stop`), so `stop()` waits longer than that before SIGKILL, and then
    SIGKILLs whatever is left of each SGLang's process group (the `pid` of its ready line).
    """

    command = "worker"
    what = "SGLang worker"
    event = "sglang_worker"
    kill_grace_s = 25.0

    def __init__(self, settings: SglangSettings, *, page_size: int) -> None:
        super().__init__(settings.workers)
        self.settings = settings
        self.page_size = page_size

    def _args(self) -> list[str]:
        s = self.settings
        assert s.model_path is not None  # HomingConfig refuses launch = "sglang" without
        return [
            "--model", s.model_path,
            "--host", "127.0.0.1",
            "--port", "0",
            "--page-size", str(self.page_size),
            "--max-total-tokens", str(s.max_total_tokens),
            "--device", s.device,
            "--tp", str(s.tp),
            "--startup-timeout-s", str(s.startup_timeout_s),
            *(["--python", s.python] if s.python else []),
            "--parent-pid", str(os.getpid()),
            *(f"--sglang-arg={arg}" for arg in s.extra_args),
        ]  # fmt: skip

    async def stop(self, grace_s: float = 25.0) -> None:
        """SIGTERM every child, SIGKILL those still alive after `grace_s`, then SIGKILL any
        process left in their SGLang process groups."""
        groups = [child.group for child in self.children if child.group is not None]
        await super().stop(grace_s)
        for pgid in groups:
            if kill_group(pgid):
                log.warning("sglang_group_killed", pgid=pgid)
