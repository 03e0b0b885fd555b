"""Launch one real SGLang worker (`python -m sglang.launch_server --smg-grpc-mode`) and stop it.

Rule of this file: the one place that knows SGLang's command line. `build_command` is pure:
a `SglangLaunch` (every port fixed) -> argv and the environment variables to add.
`resolve_ports` picks free ports for those given as 0; `resolve_device` settles
`device="auto"`, `default_python` and `check_sglang` which interpreter has SGLang.
`start_sglang` runs the command in a process group of its own, tied to our life, and
returns once the worker serves; `SglangProcess.stop` ends the whole group.

Flags, checked against sglang 0.5.23's parser:
- `--smg-grpc-mode`: the gRPC server speaking `sglang.grpc.scheduler.SglangScheduler` and
  `grpc.health.v1` listens on `--port`. SGLang still derives `--grpc-port` (default
  `--port` + 10000) and rejects it above 65535 although this mode binds nothing on it, so
  it is given as `--port` itself (allowed in this mode only).
- `--smg-http-sidecar-port`, `--nccl-port`: fixed, so no helper port is left to chance
  (torch's gloo binds the NCCL port on 0.0.0.0).
- `--max-total-tokens`: without it SGLang sizes the KV pool from free memory.
- `--kv-events-config` with `"bind": true`: the publisher listens on the endpoint (without
  it a `tcp://127.0.0.1:K` endpoint makes it connect, and no event reaches a subscriber).
- CPU: `SGLANG_USE_CPU_ENGINE=1` (else SGLang never treats the device as CPU), `--device cpu
  --attention-backend torch_native`, `--sleep-on-idle` (else the idle scheduler spins a core).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from homing.engines.client import DEFAULT_CHANNEL_OPTIONS, EngineClient
from homing.lifeline import LIFELINE, child_environ

log = structlog.get_logger(__name__)

Device = Literal["cpu", "cuda"]

#: Env var naming the Python interpreter that has SGLang installed.
PYTHON_ENV = "HOMING_SGLANG_PYTHON"

#: The servicer's service name; its grpc.health.v1 status turns SERVING once the
#: scheduler is up (smg-grpc-servicer 0.14.1, `SGLangHealthServicer.SGLANG_SERVICE`).
SCHEDULER_SERVICE = "sglang.grpc.scheduler.SglangScheduler"

#: Seconds one SglangScheduler HealthCheck may take while starting: it runs a one-token
#: generation inside the engine, and the first one on a CPU takes about a second
#: (SGLang's own bound is SGLANG_HEALTH_CHECK_TIMEOUT, 20 s).
STARTUP_HEALTH_TIMEOUT_S = 30.0

#: Seconds between readiness polls while the worker starts.
POLL_INTERVAL_S = 0.5


@dataclass(frozen=True)
class SglangLaunch:
    """One SGLang worker to start.

    `port`: the gRPC port (SglangScheduler and grpc.health.v1). `sidecar_port`: SGLang's
    HTTP sidecar (metrics). `nccl_port`: torch.distributed's rendezvous. `kv_events_port`:
    the ZMQ KV-event publisher, on 127.0.0.1. A port of 0 means "pick a free one"
    (`resolve_ports`); `build_command` needs them all set. `page_size`: KV page size in
    tokens (16: homing's router block size). `max_total_tokens`: KV pool size in tokens.
    `tp`: tensor-parallel size. `extra_args`: appended to SGLang's command line as they are.
    `python`: the interpreter with SGLang installed.
    """

    model_path: str
    host: str = "127.0.0.1"
    port: int = 0
    sidecar_port: int = 0
    nccl_port: int = 0
    kv_events_port: int = 0
    page_size: int = 16
    max_total_tokens: int = 65536
    device: Device = "cpu"
    tp: int = 1
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()
    python: str = field(default=sys.executable)

    @property
    def url(self) -> str:
        """The worker's gRPC URL, `grpc://host:port`."""
        return f"grpc://{_url_host(self.host)}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str:
        """Where a subscriber connects for KV events, `tcp://127.0.0.1:K`."""
        return f"tcp://127.0.0.1:{self.kv_events_port}"


@dataclass(frozen=True)
class SglangCommand:
    """`argv` to execute and `env`: variables to set on top of the inherited environment."""

    argv: list[str]
    env: dict[str, str]


def build_command(launch: SglangLaunch) -> SglangCommand:
    """SGLang's command line and added environment for `launch` (see the module docstring).

    Raises ValueError when a port is still 0 or a size is out of range.
    """
    ports = {
        "port": launch.port,
        "sidecar_port": launch.sidecar_port,
        "nccl_port": launch.nccl_port,
        "kv_events_port": launch.kv_events_port,
    }
    for name, port in ports.items():
        if not 1 <= port <= 65535:
            raise ValueError(
                f"{name} must be in 1..65535 (resolve_ports picks free ones), got {port}"
            )
    if len(set(ports.values())) != len(ports):
        raise ValueError(f"ports must differ, got {ports}")
    for name, value in (
        ("page_size", launch.page_size),
        ("max_total_tokens", launch.max_total_tokens),
        ("tp", launch.tp),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    kv_events = {
        "publisher": "zmq",
        "endpoint": launch.kv_events_endpoint,
        "bind": True,
        "topic": "kv-events",
    }
    argv = [
        launch.python, "-m", "sglang.launch_server",
        "--model-path", launch.model_path,
        "--host", launch.host,
        "--port", str(launch.port),
        "--smg-grpc-mode",
        "--grpc-port", str(launch.port),
        "--smg-http-sidecar-port", str(launch.sidecar_port),
        "--nccl-port", str(launch.nccl_port),
        "--page-size", str(launch.page_size),
        "--max-total-tokens", str(launch.max_total_tokens),
        "--tp-size", str(launch.tp),
        "--skip-server-warmup",
        "--kv-events-config", json.dumps(kv_events, separators=(",", ":")),
    ]  # fmt: skip
    env: dict[str, str] = {}
    if launch.device == "cpu":
        argv += ["--device", "cpu", "--attention-backend", "torch_native", "--sleep-on-idle"]
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    else:
        argv += ["--device", "cuda"]
    if launch.served_model_name is not None:
        argv += ["--served-model-name", launch.served_model_name]
    argv += list(launch.extra_args)
    return SglangCommand(argv=argv, env=env)


def resolve_ports(launch: SglangLaunch) -> SglangLaunch:
    """`launch` with every port of 0 replaced by a distinct free one.

    Each port, picked or given, is checked bindable where SGLang binds it (`host` for gRPC
    and the sidecar, 127.0.0.1 for KV events, 0.0.0.0 for NCCL); raises OSError naming the
    first that is not. A picked port is free on every address (bound on 0.0.0.0).
    """
    wanted = {
        "port": (launch.port, launch.host),
        "sidecar_port": (launch.sidecar_port, launch.host),
        "nccl_port": (launch.nccl_port, "0.0.0.0"),
        "kv_events_port": (launch.kv_events_port, "127.0.0.1"),
    }
    taken = {port for port, _ in wanted.values() if port}
    chosen: dict[str, int] = {}
    holders: list[socket.socket] = []  # held open until all are picked, so they differ
    try:
        for name, (port, host) in wanted.items():
            if port:
                _check_bindable(host, port, name)
                chosen[name] = port
                continue
            while True:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind(("0.0.0.0", 0))
                holders.append(sock)
                picked = int(sock.getsockname()[1])
                if picked not in taken:
                    break
            taken.add(picked)
            chosen[name] = picked
    finally:
        for sock in holders:
            sock.close()
    return replace(launch, **chosen)


def _check_bindable(host: str, port: int, name: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(
                err.errno, f"{name} {host}:{port} cannot be bound: {err.strerror}"
            ) from None


def resolve_device(device: str) -> Device:
    """`"auto"` -> "cuda" when `nvidia-smi` runs and exits 0, else "cpu"; "cpu" and
    "cuda" as they are; ValueError for anything else."""
    if device in ("cpu", "cuda"):
        return device  # type: ignore[return-value]
    if device != "auto":
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        done = subprocess.run([smi], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return "cuda" if done.returncode == 0 else "cpu"


def default_python(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> str:
    """The interpreter to run SGLang with when none is given: `$HOMING_SGLANG_PYTHON`, else
    `.venv-sglang/bin/python` under `cwd` or under the repository root (the directory
    above `src/homing`), whichever exists first, else this interpreter."""
    env = os.environ if environ is None else environ
    if env.get(PYTHON_ENV):
        return env[PYTHON_ENV]
    repo_root = Path(__file__).resolve().parents[3]
    for base in (cwd or Path.cwd(), repo_root):
        candidate = base / ".venv-sglang" / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    return sys.executable


#: Run by `check_sglang`: prints sglang's version, exits 3 when it is not installed. It
#: finds the package without importing it: `import sglang` costs about 8 CPU seconds (18 s
#: on a loaded 2-core machine), added to every worker's start.
_PROBE = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "if u.find_spec('sglang') is None: sys.exit(3)\n"
    "print(m.version('sglang'))\n"
)


def check_sglang(python: str, timeout_s: float = 60.0) -> str:
    """sglang's version as installed for `python`; raises ValueError saying why when
    there is none (a missing interpreter, no sglang, no answer within `timeout_s`).

    The package is found, not imported: a broken install shows as SGLang exiting before
    it serves (`start_sglang`).
    """
    try:
        done = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        raise ValueError(f"python {python!r} does not exist") from None
    except OSError as err:
        raise ValueError(f"python {python!r} cannot run: {err.strerror or err}") from None
    except subprocess.TimeoutExpired:
        raise ValueError(f"python {python!r} did not answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = "not installed" if done.returncode == 3 or not lines else lines[-1]
        raise ValueError(
            f"sglang cannot be imported with {python} ({why}); install it there "
            f"or name another interpreter (--python or ${PYTHON_ENV})"
        )
    version = done.stdout.strip()
    if not version:
        raise ValueError(f"{python} did not report an sglang version (is it a Python?)")
    return version


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group `pgid`, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != b"Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to process group `pgid` if it has a live member; True if it had one."""
    if not group_members(pgid):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    return True


@dataclass
class SglangProcess:
    """A started SGLang worker: its process (the leader of its own process group)."""

    launch: SglangLaunch
    process: asyncio.subprocess.Process

    @property
    def pid(self) -> int:
        """The SGLang launcher's PID, also its process group's ID."""
        return self.process.pid

    async def wait(self) -> int:
        """Wait until the SGLang launcher exits; its exit code."""
        return await self.process.wait()

    async def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL what is left of it after `grace_s`, reap the
        launcher, and wait (up to 5 s more) until no process of the group is alive.

        The launcher's own SIGTERM handler drains the gRPC server and terminates its
        scheduler processes (about 2 s per process at most, smg-grpc-servicer's bound).
        """
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self.process.wait()
        await _group_gone(pgid, deadline - time.monotonic())
        if kill_group(pgid):
            log.warning("sglang_killed", pid=pgid, grace_s=grace_s)
        await self.process.wait()
        if not await _group_gone(pgid, 5.0, kill=True):
            log.warning("sglang_group_left", pid=pgid, members=group_members(pgid))


async def _group_gone(pgid: int, within_s: float, *, kill: bool = False) -> bool:
    """Poll /proc every 0.1 s until group `pgid` has no live member (True) or `within_s`
    passes (False); `kill`: SIGKILL the group at each poll."""
    deadline = time.monotonic() + within_s
    while True:
        if not group_members(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        if kill:
            kill_group(pgid)
        await asyncio.sleep(0.1)


async def start_sglang(
    launch: SglangLaunch,
    *,
    startup_timeout_s: float = 300.0,
    environ: Mapping[str, str] | None = None,
) -> SglangProcess:
    """Start SGLang for `launch` (ports resolved) and return it once it serves; it is
    SIGTERMed by Linux if this process dies.

    Ready means: grpc.health.v1 reports the scheduler service SERVING, then one
    SglangScheduler `HealthCheck` (a one-token generation) answers healthy. Its stdout and
    stderr go to our stderr. Raises RuntimeError naming the exit code when the process
    exits first, TimeoutError past `startup_timeout_s`; either way the group is stopped.
    """
    command = build_command(launch)
    env = child_environ(environ)  # no NOTIFY_SOCKET, WATCHDOG_* or LISTEN_*: homing's own
    env.update(command.env)
    process = await asyncio.create_subprocess_exec(
        launch.python,
        "-c",
        LIFELINE,
        str(os.getpid()),
        *command.argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=2,  # our stderr: our stdout carries only the ready line
        stderr=2,
        start_new_session=True,
    )
    worker = SglangProcess(launch, process)
    try:
        async with asyncio.timeout(startup_timeout_s):
            await _wait_ready(worker)
    except TimeoutError:
        await worker.stop(grace_s=5.0)
        raise TimeoutError(
            f"SGLang worker {launch.url} (pid {process.pid}) did not serve within "
            f"{startup_timeout_s:g} s"
        ) from None
    except BaseException:
        await worker.stop(grace_s=5.0)
        raise
    return worker


async def _wait_ready(worker: SglangProcess) -> None:
    """Poll until the worker serves; RuntimeError when its process exits first."""
    launch = worker.launch
    target = f"{_url_host(launch.host)}:{launch.port}"
    exited = asyncio.ensure_future(worker.process.wait())
    client = EngineClient(launch.url, worker_id=launch.url)
    try:
        # Short reconnect backoff (at most 2 s): grpc's default grows to many seconds
        # while the port is still closed, delaying the first poll after it opens.
        async with grpc.aio.insecure_channel(target, options=DEFAULT_CHANNEL_OPTIONS) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            serving = False
            while True:
                if not serving:
                    serving = await _health_serving(stub)
                if serving and await _first(
                    client.health_check(timeout_s=STARTUP_HEALTH_TIMEOUT_S), exited
                ):
                    return
                if exited.done():
                    raise RuntimeError(
                        f"SGLang worker {launch.url} exited with code {exited.result()} "
                        "before it served"
                    )
                await asyncio.wait({exited}, timeout=POLL_INTERVAL_S)
    finally:
        exited.cancel()
        await client.close()


async def _health_serving(stub: health_pb2_grpc.HealthStub) -> bool:
    request = health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE)
    try:
        resp = await stub.Check(request, timeout=2.0)
    except grpc.aio.AioRpcError:
        return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


async def _first(check: Coroutine[Any, Any, bool], exited: asyncio.Future[int]) -> bool:
    """Run `check` until it answers or the process exits (then False)."""
    task = asyncio.ensure_future(check)
    await asyncio.wait({task, exited}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    return bool(task.result())


def _url_host(host: str) -> str:
    """The host to put in a URL: a wildcard bind address is reached on loopback."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
