"""`homing sim`: host N simulated SGLang workers in one process (uvloop).

Rule of this file: command-line edge only. Options become one `SimConfig`; the workers start
on `--port`, `--port`+1, ... (or free ports with `--port 0`); when all serve, exactly one JSON
line goes to stdout:

    {"event": "ready", "workers": [{"url": "grpc://127.0.0.1:PORT", "port": PORT}, ...]}

Logs go to stderr. SIGINT / SIGTERM stop the workers (open streams end with "abort") and the
process exits 0; a bad option or a port that cannot be bound exits 2 with a message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys

import uvloop

from homing.sim.config import SimConfig
from homing.sim.timing import MODELS, model_spec
from homing.sim.worker import SimWorker

log = logging.getLogger("homing.sim")


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `homing sim` options to `parser`."""
    parser.add_argument("--workers", type=int, default=1, help="workers to host (default 1)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=0, help="first worker's port, then +1 each; 0 = free ports"
    )
    parser.add_argument(
        "--model",
        default="llama-3.1-8b",
        help=f"model preset: {', '.join(sorted(MODELS))} (default llama-3.1-8b)",
    )
    parser.add_argument("--gpu", default=None, help="H100 or H200 (default: the model's preset)")
    parser.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel degree (default: the model's preset)"
    )
    parser.add_argument(
        "--speedup", type=float, default=1.0, help="simulated time runs this much faster"
    )
    parser.add_argument("--page-size", type=int, default=16, help="KV page size (default 16)")
    parser.add_argument(
        "--kv-capacity-tokens", type=int, default=None, help="KV pool size (default: derived)"
    )
    parser.add_argument(
        "--max-running-requests", type=int, default=None, help="admission window (default: derived)"
    )
    parser.add_argument(
        "--chunked-prefill-size", type=int, default=8192, help="prefill tokens per step"
    )
    parser.add_argument(
        "--served-model-name", default=None, help="model name to report (default: --model)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for sampled outputs")


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The `SimConfig` the options describe; raises ValueError for an unknown model or a
    value out of range."""
    spec = model_spec(args.model)
    return SimConfig(
        model=spec.name,
        gpu=args.gpu or spec.default_gpu,
        tp=args.tp or spec.default_tp,
        page_size=args.page_size,
        chunked_prefill_size=getattr(args, "chunked_prefill_size", 8192),
        max_running_requests=args.max_running_requests,
        kv_capacity_tokens=args.kv_capacity_tokens,
        speedup=args.speedup,
        seed=args.seed,
        served_model_name=getattr(args, "served_model_name", None),
    )


def run_sim(args: argparse.Namespace) -> int:
    """Run `homing sim` until SIGINT/SIGTERM; returns the exit code (0, or 2 on bad input)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
        )
    try:
        config = config_from_args(args)
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        workers = [
            SimWorker(config, host=args.host, port=args.port + i if args.port else 0)
            for i in range(args.workers)
        ]
    except ValueError as exc:
        print(f"homing sim: {exc}", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_serve(workers))


async def _serve(workers: list[SimWorker]) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started: list[SimWorker] = []
    try:
        try:
            for worker in workers:
                await worker.start()
                started.append(worker)
        except RuntimeError as exc:
            print(f"homing sim: {exc}", file=sys.stderr)
            return 2
        ready = {
            "event": "ready",
            "workers": [{"url": w.url, "port": w.port} for w in started],
        }
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        first = started[0]
        log.info(
            "serving %d simulated worker(s): %s on %s x%d, KV pool %d tokens, "
            "max running %d, speedup %g",
            len(started),
            first.config.model,
            first.timing.gpu.name,
            first.config.tp,
            first.limits.kv_capacity_tokens,
            first.limits.max_running_requests,
            first.config.speedup,
        )
        await stop.wait()
        log.info("stopping")
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await asyncio.gather(*(w.stop() for w in started), return_exceptions=True)
