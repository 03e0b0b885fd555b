"""Engine workers as real child processes, one kind at a time: simulated (`homing sim`) or real
SGLang (`homing worker`). Each prints a JSON ready line with its URL; a worker can be killed
with SIGKILL (its whole process tree, as when its machine dies) or stopped with SIGTERM, and
started again on its port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from sglang_env import SGLANG_PYTHON, TINY_MODEL, fast_start_env

ENGINES = ("sim", "sglang")
"""The engine kinds the protocol suite runs against."""

STARTUP_TIMEOUT_S = {"sim": 60.0, "sglang": 300.0}

SMALL_POOL_TOKENS = 1024
"""A KV pool a few prompts fill (tokens; 64 pages of 16), for workers meant to evict."""


def _command(engine: str, port: int, kv_tokens: int | None = None) -> list[str]:
    base = [sys.executable, "-m", "homing"]
    if engine == "sim":
        pool = [] if kv_tokens is None else ["--kv-capacity-tokens", str(kv_tokens)]
        return [*base, "sim", "--workers", "1", "--port", str(port), "--speedup", "10", *pool]
    return [
        *base,
        "worker",
        "--model",
        str(TINY_MODEL),
        "--python",
        str(SGLANG_PYTHON),
        "--port",
        str(port),
        "--device",
        "cpu",
        # A grammar backend (SGLang's default, named so a change of default shows), JSON
        # without free whitespace: the random-weight model would otherwise fill a constrained
        # answer with spaces up to its length limit.
        "--sglang-arg=--grammar-backend",
        "--sglang-arg=xgrammar",
        "--sglang-arg=--constrained-json-disable-any-whitespace",
        *([] if kv_tokens is None else ["--max-total-tokens", str(kv_tokens)]),
    ]


@dataclass
class EngineWorker:
    """One worker process: `url` grpc://127.0.0.1:PORT, `engine_pid` the engine's own pid,
    `ready` its ready line, `later_output` the lines it printed on stdout after that line."""

    engine: str
    process: subprocess.Popen[bytes]
    url: str = ""
    port: int = 0
    engine_pid: int = 0
    ready: dict[str, Any] = field(default_factory=dict)
    later_output: list[bytes] = field(default_factory=list)
    drain: threading.Thread | None = None


@dataclass
class Fleet:
    """Workers of one engine kind; `close()` stops them all. `kv_tokens`: their KV pool size
    in tokens (None: the engine's default here, 65,536 for `homing worker`, the timing
    model's for `homing sim`)."""

    engine: str
    workers: list[EngineWorker] = field(default_factory=list)
    kv_tokens: int | None = None

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def start(self, count: int) -> None:
        """Start `count` workers on free ports, in parallel; raises RuntimeError on failure."""
        started = [self._spawn(0) for _ in range(count)]
        try:
            for worker in started:
                self._wait_ready(worker)
        except BaseException:
            for worker in started:
                _kill_tree(worker)
            raise
        self.workers.extend(started)

    def kill(self, index: int) -> None:
        """SIGKILL worker `index` and its whole process tree, and reap it."""
        _kill_tree(self.workers[index])

    def restart(self, index: int) -> EngineWorker:
        """Start worker `index` again on the same port (after `kill`)."""
        old = self.workers[index]
        deadline = time.monotonic() + 30.0
        while True:  # the port may linger a moment after a kill
            worker = self._spawn(old.port)
            try:
                self._wait_ready(worker)
                break
            except RuntimeError:
                _kill_tree(worker)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.workers[index] = worker
        return worker

    def stop(self, index: int, timeout_s: float = 30.0) -> int:
        """SIGTERM worker `index` (the `homing worker` or `homing sim` process) and wait for
        it; its exit status, with its stdout read to the end. `subprocess.TimeoutExpired`
        when it has not exited within `timeout_s`."""
        worker = self.workers[index]
        worker.process.send_signal(signal.SIGTERM)
        code = worker.process.wait(timeout=timeout_s)
        if worker.drain is not None:
            worker.drain.join(timeout=timeout_s)
            if worker.drain.is_alive():
                raise RuntimeError(f"worker {index}'s stdout still open {timeout_s} s after exit")
        return code

    def ensure_running(self) -> None:
        """Start again, on its port, each worker whose process has exited (a test stopped
        it), so that a test never gets a dead worker whatever order the tests ran in."""
        for index, worker in enumerate(self.workers):
            if worker.process.poll() is not None:
                _kill_tree(worker)
                self.restart(index)

    def close(self) -> None:
        """SIGTERM every worker, SIGKILL any still alive after 20 s."""
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.process.wait(timeout=20.0)
            except subprocess.TimeoutExpired:
                pass
            _kill_tree(worker)
        self.workers.clear()

    def _spawn(self, port: int) -> EngineWorker:
        env = {**os.environ, **(fast_start_env() if self.engine == "sglang" else {})}
        process = subprocess.Popen(
            _command(self.engine, port, self.kv_tokens),
            env=env,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return EngineWorker(self.engine, process)

    def _wait_ready(self, worker: EngineWorker) -> None:
        assert worker.process.stdout is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S[self.engine]
        while time.monotonic() < deadline:
            line = worker.process.stdout.readline()
            if not line:
                code = worker.process.wait()
                raise RuntimeError(f"{self.engine} worker exited with code {code} before ready")
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(message, dict) and message.get("event") == "ready":
                info = message["workers"][0]
                worker.url = info["url"]
                worker.port = int(info["port"])
                worker.engine_pid = int(info.get("pid", worker.process.pid))
                worker.ready = message
                worker.drain = threading.Thread(
                    target=_drain, args=(worker.process.stdout, worker.later_output), daemon=True
                )
                worker.drain.start()
                return
        raise RuntimeError(f"{self.engine} worker not ready within the startup timeout")


def _drain(stream: IO[bytes], lines: list[bytes]) -> None:
    """Read what the worker still prints into `lines`, so it never blocks on a full pipe."""
    for line in stream:
        lines.append(line)


def _kill_tree(worker: EngineWorker) -> None:
    """SIGKILL the worker's process group and the engine's own group (each is a session
    leader, so its pid is its group id; a group outlives its leader)."""
    groups: Sequence[int] = sorted({worker.process.pid, worker.engine_pid} - {0})
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    worker.process.wait()
