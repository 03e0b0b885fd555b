"""The processes of `make bench-overhead`: two instant simulated workers, the gateways under
test over them (`homing serve` of this tree, of an older `--homing-before-src` checkout and
in two configurations, and `smg launch`), the grpc.aio floor's child, and this process's
HTTP and gRPC clients to all of them.

Rule of this file: starting, waiting for and stopping processes; what is sent to them is
`client`, what is measured is `phases`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgl_grpc

from homing.bench.overhead.floor import FloorClient
from homing.bench.overhead.procfs import children, cpu_seconds, stat_cpu_seconds
from homing.bench.overhead.targets import (
    BASE_CONFIG,
    GRPC_FLOOR,
    HOMING,
    HOMING_BEFORE,
    HOMING_GRPC,
    HOMING_NOMETRICS,
    HOMING_P2,
    NOMETRICS_CONFIG,
    P2_PROCESSES,
    SMG,
    STREAM_INTERVALS,
    TARGETS,
)
from homing.bench.overhead.workload import PROMPT_TEXT, READY_TIMEOUT_S, REQUEST_TIMEOUT_S
from homing.bench.routers import free_port
from homing.lifeline import child_environ
from homing.sim.process import spawn_sim, terminate
from homing.sim.timing import model_spec
from homing.text.served import load_served_tokenizer
from homing.v1 import inference_pb2_grpc as api_grpc

SIM_MODEL = "llama-3.1-8b"
SMG_MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
"""The config.json smg finds for the workers' model: what their GetModelInfo reports."""


@dataclass
class Stack:
    """Two instant workers, the selected gateways over them (and the grpc.aio floor's child),
    and this process's clients. `targets`: those of TARGETS to start; `before_src`: the old
    checkout's `src` directory for HOMING_BEFORE."""

    log_dir: Path
    targets: frozenset[str] = frozenset(TARGETS) - {HOMING_BEFORE}
    before_src: Path | None = None
    model: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    sims: list[asyncio.subprocess.Process] = field(default_factory=list)
    worker_urls: list[str] = field(default_factory=list)
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    http_urls: dict[str, str] = field(default_factory=dict)
    grpc_target: str = ""
    floor: FloorClient | None = None
    session: aiohttp.ClientSession | None = None
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    api_stub: api_grpc.InferenceStub | None = None
    worker_stubs: list[sgl_grpc.SglangSchedulerStub] = field(default_factory=list)
    _scratch: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        """Start everything and wait until every gateway serves the model over both workers.
        Raises RuntimeError (with the log to read) when a process fails to come up."""
        # Every process is started before this one opens a gRPC channel: a fork while grpc's
        # threads run skips grpc's fork handlers (and logs that it did).
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._scratch = tempfile.TemporaryDirectory(prefix="homing-overhead-")
        scratch = Path(self._scratch.name)
        sim_args = ["--instant", "--model", SIM_MODEL, "--port", "0"]
        for i in range(2):
            with (self.log_dir / f"sim-{i}.log").open("wb") as log:
                proc, ready = await spawn_sim(
                    [*sim_args, "--parent-pid", str(os.getpid())], stderr=log.fileno()
                )
            self.sims.append(proc)
            self.worker_urls.append(ready["workers"][0]["url"])
        self.model = SIM_MODEL
        self.prompt_ids = load_served_tokenizer().encode_chat(
            [{"role": "user", "content": PROMPT_TEXT}]
        )
        if GRPC_FLOOR in self.targets:
            self.floor = await FloorClient.spawn(
                self.worker_urls[0], self.prompt_ids, self.log_dir / f"{GRPC_FLOOR}.log"
            )
        interval_configs = {}
        for name, interval in STREAM_INTERVALS.items():
            interval_configs[name] = scratch / f"{name}.toml"
            interval_configs[name].write_text(f"[engines]\nstream_interval = {interval}\n")
        nometrics_config = scratch / "homing-nometrics.toml"
        nometrics_config.write_text(NOMETRICS_CONFIG)
        base_config = scratch / "homing.toml"
        base_config.write_text(BASE_CONFIG)
        async with asyncio.TaskGroup() as group:  # one failing stops the others' wait
            if self.targets & {HOMING, HOMING_GRPC}:
                group.create_task(self._start_homing(HOMING, scratch, config=base_config))
            if HOMING_BEFORE in self.targets:
                assert self.before_src is not None
                pythonpath = {"PYTHONPATH": str(self.before_src)}
                # A tree older than `[engines] stream_interval` streams a token per chunk
                # anyway, and would refuse the key.
                before_config = base_config if _knows_stream_interval(self.before_src) else None
                group.create_task(
                    self._start_homing(
                        HOMING_BEFORE, scratch, env=pythonpath, as_found=True, config=before_config
                    )
                )
            for name, config in interval_configs.items():
                if name in self.targets:
                    group.create_task(self._start_homing(name, scratch, config=config))
            if HOMING_NOMETRICS in self.targets:
                group.create_task(
                    self._start_homing(HOMING_NOMETRICS, scratch, config=nometrics_config)
                )
            if HOMING_P2 in self.targets:
                group.create_task(
                    self._start_homing(
                        HOMING_P2,
                        scratch,
                        config=base_config,
                        flags=["--processes", str(P2_PROCESSES)],
                    )
                )
            if SMG in self.targets:
                group.create_task(self._start_smg(scratch / "smg"))
        for url in self.worker_urls:
            channel = grpc.aio.insecure_channel(url.removeprefix("grpc://"))
            self.channels.append(channel)
            self.worker_stubs.append(sgl_grpc.SglangSchedulerStub(channel))
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            connector=aiohttp.TCPConnector(limit=0),
        )
        if self.grpc_target:
            channel = grpc.aio.insecure_channel(self.grpc_target)
            self.channels.append(channel)
            self.api_stub = api_grpc.InferenceStub(channel)

    async def _start_homing(
        self,
        name: str,
        scratch: Path,
        env: dict[str, str] | None = None,
        config: Path | None = None,
        as_found: bool = False,
        flags: list[str] | None = None,
    ) -> None:
        """`homing serve` over the workers as `name`: `env` added to ours, `config` its
        `--config` (the flags given here, and `flags`, override what it says). `as_found`: with
        `GRPC_EXPERIMENTS` as this process found it, before homing set its default (an older
        tree decides for itself, as it did when it ran alone)."""
        port, grpc_port = free_port(), free_port()
        argv = [
            sys.executable, "-m", "homing", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", str(grpc_port), "--policy", "round_robin", "--log-level", "warning",
        ]  # fmt: skip
        if config is not None:
            argv += ["--config", str(config)]
        argv += flags or []
        for url in self.worker_urls:
            argv += ["--worker", url]
        state = scratch / f"{name}-state"  # its own admin socket, whatever else runs here
        state.mkdir()
        base = child_environ() if as_found else dict(os.environ)
        child_env = {**base, "HOMING_STATE_DIR": str(state), **(env or {})}
        await self._spawn(name, argv, env=child_env, cwd=None)
        self.http_urls[name] = f"http://127.0.0.1:{port}"
        if name == HOMING:
            self.grpc_target = f"127.0.0.1:{grpc_port}"

        async def ready(http: aiohttp.ClientSession) -> bool:
            return await self._homing_ready(http, name)

        await _wait_until(self.procs[name], self.log_dir / f"{name}.log", ready)

    async def _start_smg(self, cwd: Path) -> None:
        config_dir = cwd / model_spec(SIM_MODEL).hf_path  # the workers' tokenizer_path
        config_dir.mkdir(parents=True)
        (config_dir / "config.json").write_text(json.dumps(SMG_MODEL_CONFIG))
        port = free_port()
        binary = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
        if binary is None:
            raise RuntimeError("smg is not installed (`pip install -e '.[test]'` brings it)")
        argv = [
            binary, "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *self.worker_urls, "--policy", "round_robin",
            "--log-level", "warn", "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()),
        ]  # fmt: skip
        await self._spawn(SMG, argv, env=None, cwd=cwd)
        self.http_urls[SMG] = f"http://127.0.0.1:{port}"
        await _wait_until(self.procs[SMG], self.log_dir / "smg.log", self._smg_ready)

    async def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None, cwd: Path | None
    ) -> None:
        with (self.log_dir / f"{name}.log").open("wb") as log:
            self.procs[name] = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=cwd
            )

    async def _models(self, http: aiohttp.ClientSession, base: str) -> set[str]:
        async with http.get(f"{base}/v1/models") as resp:
            if resp.status != 200:
                return set()
            return {m["id"] for m in (await resp.json())["data"]}

    async def _homing_ready(self, http: aiohttp.ClientSession, name: str) -> bool:
        base = self.http_urls[name]
        async with http.get(f"{base}/ready") as resp:
            if resp.status != 200:
                return False
        return self.model in await self._models(http, base)

    async def _smg_ready(self, http: aiohttp.ClientSession) -> bool:
        base = self.http_urls[SMG]
        async with http.get(f"{base}/readiness") as resp:
            if resp.status != 200 or (await resp.json()).get("healthy_workers") != 2:
                return False
        return self.model in await self._models(http, base)

    def gateway_pid(self, target: str) -> int:
        """The process whose CPU a target's requests cost (homing for its gRPC API too, the
        floor's child for GRPC_FLOOR; HOMING_P2's leader)."""
        if target == GRPC_FLOOR:
            assert self.floor is not None
            return self.floor.proc.pid
        return self.procs[HOMING if target == HOMING_GRPC else target].pid

    def gateway_pids(self, target: str) -> list[int]:
        """Every process whose CPU a target's requests cost: `gateway_pid`, and for
        HOMING_P2 its other gateway processes (its children that are not workers)."""
        pid = self.gateway_pid(target)
        return [pid, *children(pid)] if target == HOMING_P2 else [pid]

    def gateway_cpu_s(self, pids: list[int]) -> tuple[float, float]:
        """CPU seconds of `pids` together so far: (process clocks, /proc ticks)."""
        return sum(cpu_seconds(p) for p in pids), sum(stat_cpu_seconds(p) for p in pids)

    def worker_cpu_s(self) -> float:
        """CPU seconds of both workers so far."""
        return sum(cpu_seconds(p.pid) for p in self.sims)

    async def stop(self) -> None:
        """Close the clients, stop the gateways and the floor's child, then the workers
        (SIGTERM, SIGKILL after 10 s)."""
        if self.session is not None:
            await self.session.close()
        for channel in self.channels:
            with contextlib.suppress(Exception):
                await channel.close()
        children = list(self.procs.values())
        if self.floor is not None:
            children.append(self.floor.proc)
        await terminate(children, grace_s=10)
        await terminate(self.sims, grace_s=10)
        if self._scratch is not None:
            self._scratch.cleanup()


async def _wait_until(
    proc: asyncio.subprocess.Process,
    log_path: Path,
    ready: Callable[[aiohttp.ClientSession], Awaitable[bool]],
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"exited with {proc.returncode} before ready; see {log_path}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if await ready(http):
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"not ready within {READY_TIMEOUT_S:g} s; see {log_path}")


def _knows_stream_interval(src: Path) -> bool:
    """Whether the homing tree under `src` (a `src` directory) has `[engines]
    stream_interval` in its config."""
    engines = src / "homing" / "config" / "engines.py"
    return engines.is_file() and "stream_interval" in engines.read_text()
