"""`homing worker`: run one real SGLang worker (`homing.engines.sglang_launch`) until a signal.

Rule of this file: command-line edge only. When SGLang serves, exactly one JSON line goes to
stdout, shaped as `homing sim`'s:

    {"event": "ready", "workers": [{"url": "grpc://127.0.0.1:PORT", "port": PORT,
                                    "pid": SGLANG_PID, "kv_events": "tcp://127.0.0.1:K"}]}

`pid` is SGLang's launcher, the leader of its own process group. SGLang's output and our
logs go to stderr. SIGINT / SIGTERM stop SGLang (its whole process group) and the process
exits 0; when SGLang exits on its own, or fails to start, it exits 1; bad input (no model
directory, no config.json in it, an interpreter without sglang, a port that cannot be bound)
exits 2 with one `homing worker: ...` line, before anything is started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time

from homing.config.rules import check_model_dir
from homing.engines.sglang_launch import (
    SglangLaunch,
    SglangProcess,
    check_sglang,
    default_python,
    resolve_device,
    resolve_ports,
    start_sglang,
)
from homing.lifeline import exit_with_parent

log = logging.getLogger("homing.worker")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `homing worker` options to `parser`."""
    parser.add_argument(
        "--model", required=True, help="model directory (holding config.json) for SGLang"
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=0, help="gRPC port (default 0: a free one, as its helpers)"
    )
    parser.add_argument(
        "--page-size", type=int, default=16, help="KV page size, tokens (default 16)"
    )
    parser.add_argument(
        "--max-total-tokens", type=int, default=65536, help="KV pool size, tokens (default 65536)"
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto: cuda when nvidia-smi runs, else cpu (default auto)",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    parser.add_argument(
        "--python",
        default=None,
        help="interpreter with sglang installed (default: $HOMING_SGLANG_PYTHON, else "
        ".venv-sglang/bin/python here or in the repository, else this one)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="model name to report (default: SGLang's)"
    )
    parser.add_argument(
        "--startup-timeout-s",
        type=float,
        default=300.0,
        help="seconds SGLang may take to serve (default 300)",
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit (stopping SGLang) when this process exits (Linux PR_SET_PDEATHSIG)",
    )
    parser.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="pass ARG to sglang.launch_server as it is (repeatable; "
        "use --sglang-arg=--flag for ARGs that start with -)",
    )


def launch_from_args(args: argparse.Namespace) -> SglangLaunch:
    """The `SglangLaunch` the options describe, ports not yet resolved; raises ValueError
    for a missing model directory or config.json or a value out of range. The interpreter
    is not checked here (`check_sglang`)."""
    check_model_dir(args.model)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    for name in ("page_size", "max_total_tokens", "tp"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} must be >= 1, got {getattr(args, name)}")
    if not args.startup_timeout_s > 0:
        raise ValueError(f"--startup-timeout-s must be > 0, got {args.startup_timeout_s}")
    return SglangLaunch(
        model_path=args.model,
        host=args.host,
        port=args.port,
        page_size=args.page_size,
        max_total_tokens=args.max_total_tokens,
        device=resolve_device(args.device),
        tp=args.tp,
        served_model_name=args.served_model_name,
        extra_args=tuple(args.sglang_arg),
        python=args.python or default_python(),
    )


def run_worker(args: argparse.Namespace) -> int:
    """Run `homing worker` until SIGINT/SIGTERM; the exit code (0 after a signal, 1 when
    SGLang fails or exits on its own, 2 on bad input)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
        )
    try:
        launch = launch_from_args(args)
    except ValueError as exc:
        print(f"homing worker: {exc}", file=sys.stderr)
        return 2
    if args.parent_pid is not None and not exit_with_parent(args.parent_pid):
        print(
            f"homing worker: --parent-pid {args.parent_pid} is not our parent (it exited?)",
            file=sys.stderr,
        )
        return 1
    try:
        check_sglang(launch.python)
        launch = resolve_ports(launch)
    except (ValueError, OSError) as exc:
        print(f"homing worker: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(launch, args.startup_timeout_s))


async def _serve(launch: SglangLaunch, startup_timeout_s: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    began = time.monotonic()
    log.info(
        "starting SGLang on %s: model %s, device %s, tp %d, python %s",
        launch.url,
        launch.model_path,
        launch.device,
        launch.tp,
        launch.python,
    )
    stopping = asyncio.ensure_future(stop.wait())
    starting = asyncio.ensure_future(start_sglang(launch, startup_timeout_s=startup_timeout_s))
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # a signal while SGLang starts: start_sglang stops it
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            log.info("stopped before SGLang served")
            return 0
        try:
            worker = starting.result()
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"homing worker: {exc}", file=sys.stderr)
            return 1
        return await _run(worker, stopping, began)
    finally:
        stopping.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


async def _run(worker: SglangProcess, stopping: asyncio.Future[object], began: float) -> int:
    """Announce `worker`, then wait for a signal (0) or SGLang's own exit (1)."""
    launch = worker.launch
    ready = {
        "event": "ready",
        "workers": [
            {
                "url": launch.url,
                "port": launch.port,
                "pid": worker.pid,
                "kv_events": launch.kv_events_endpoint,
            }
        ],
    }
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    log.info(
        "serving SGLang worker %s (pid %d, KV events %s) after %.1f s",
        launch.url,
        worker.pid,
        launch.kv_events_endpoint,
        time.monotonic() - began,
    )
    exited = asyncio.ensure_future(worker.wait())
    try:
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not exited.done():
            log.info("stopping SGLang (pid %d)", worker.pid)
        await worker.stop()  # also reaps what an exited launcher left in its group
    if not stopping.done():
        log.error("SGLang (pid %d) exited on its own with code %s", worker.pid, exited.result())
        return 1
    log.info("stopped")
    return 0
