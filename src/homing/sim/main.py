"""`homing sim`: host N simulated SGLang workers in one process (uvloop); `homing sim perf`:
print what the timing model says for one input.

Rule of this file: command-line edge only. Options become one `SimConfig`; worker i serves gRPC
on `--port` + 2i and its HTTP sidecar (metrics, faults) on `--port` + 2i + 1 (with `--port 0`,
each worker gets a free pair P, P + 1); when all serve, exactly one JSON line goes to stdout:

    {"event": "ready", "workers": [{"url": "grpc://127.0.0.1:PORT", "port": PORT,
                                    "metrics_port": PORT + 1}, ...]}

Garbage collection: a radix cache holds hundreds of thousands of long-lived pages, and a full
(generation 2) collection that walks them all stops every worker for 0.1-1 s. So every
GC_FREEZE_INTERVAL_S the process collects its young generations and freezes what survived
(`gc.freeze`), and automatic full collections are made rare (threshold 100 instead of 10):
long-lived pages are then never walked again, and evicted pages, which are not in reference
cycles, are still freed by reference counting.

`--startup-delay-s D` emulates a cold start (a large model's weight loading): the process
waits D wall seconds before it binds and serves (SIGINT / SIGTERM during the wait exit 0).

Logs go to stderr. SIGINT / SIGTERM stop the workers (open streams end with "abort") and the
process exits 0; when every worker has crashed (an injected `crash` fault) it exits 1 at once;
a bad option or a port that cannot be bound exits 2 with a message.

`homing sim perf --model M --gpu G --tp N [--prefill T] [--cached C] [--batch B]
[--context X]` prints one JSON object: `prefill_ms` (T new tokens after C cached, chunked by
`--chunked-prefill-size`), `decode_step_ms` (a decode-only step of B sequences of X tokens)
and `kv_capacity_tokens` (the pool SGLang would size), plus the inputs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import signal
import sys

import uvloop

from homing.lifeline import exit_with_parent
from homing.sim.config import FINAL_TOKENS, GRAMMAR_BACKENDS, SimConfig
from homing.sim.scheduler import SCHEDULE_POLICIES
from homing.sim.timing import MODELS, TimingModel, model_spec, resolve_limits
from homing.sim.worker import SimWorker

log = logging.getLogger("homing.sim")

GC_FREEZE_INTERVAL_S = 1.0
"""Wall seconds between `gc.collect(1)` + `gc.freeze()` in a `homing sim` process."""


def _add_preset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="llama-3.1-8b",
        help=f"model preset: {', '.join(sorted(MODELS))} (default llama-3.1-8b)",
    )
    parser.add_argument("--gpu", default=None, help="H100 or H200 (default: the model's preset)")
    parser.add_argument(
        "--tp", type=int, default=None, help="tensor-parallel degree (default: the model's preset)"
    )
    parser.add_argument("--page-size", type=int, default=16, help="KV page size (default 16)")
    parser.add_argument(
        "--chunked-prefill-size", type=int, default=8192, help="prefill tokens per step"
    )
    parser.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="share of GPU memory for weights + KV pool (default: SGLang's by TP)",
    )


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `homing sim` options (and the `perf` sub-command) to `parser`."""
    parser.add_argument("--workers", type=int, default=1, help="workers to host (default 1)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=0,
        help="first worker's gRPC port (sidecar on +1, next worker on +2); 0 = free ports",
    )
    _add_preset_arguments(parser)
    parser.add_argument(
        "--speedup", type=float, default=1.0, help="simulated time runs this much faster"
    )
    parser.add_argument(
        "--instant",
        action="store_true",
        help="switch the timing model off: every step takes zero time (a zero-latency "
        "worker, to measure the gateway in front); --speedup then scales only the clock",
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit when this process (the launcher) exits (Linux PR_SET_PDEATHSIG)",
    )
    parser.add_argument(
        "--kv-capacity-tokens", type=int, default=None, help="KV pool size (default: derived)"
    )
    parser.add_argument(
        "--max-running-requests", type=int, default=None, help="admission window (default: derived)"
    )
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="waiting-queue bound; beyond it Generate answers UNAVAILABLE (default: unbounded)",
    )
    parser.add_argument(
        "--schedule-policy",
        choices=SCHEDULE_POLICIES,
        default="fcfs",
        help="waiting-queue order (default fcfs)",
    )
    parser.add_argument(
        "--stream-interval", type=int, default=1, help="tokens per streamed chunk (default 1)"
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="scale each step's time by U(1 - J, 1 + J), 0 <= J < 1 (default 0)",
    )
    parser.add_argument(
        "--final-tokens",
        choices=FINAL_TOKENS,
        default="chunk_and_complete",
        help="where a stream's last step's tokens go: a chunk repeated in the complete "
        "(SGLang 0.5.x, default) or the complete only (older servicers)",
    )
    parser.add_argument(
        "--grammar-backend",
        choices=GRAMMAR_BACKENDS,
        default="simulated",
        help="simulated: answer json_schema, regex and structural_tag constraints with an "
        "instance of them, refuse ebnf (default); none: refuse constrained requests, as SGLang "
        "without a backend; unconstrained: accept them and generate as if unconstrained",
    )
    parser.add_argument(
        "--tool-call-share",
        type=float,
        default=1.0,
        help="odds (0..1) that a chat prompt offering tools, its last turn the user's, is "
        "answered with a tool call (default 1.0: always)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="model name to report (default: --model)"
    )
    parser.add_argument(
        "--tokenizer-revision",
        default=None,
        help="serve the tokenizer bundle with this revision label added (another sha256)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for sampled outputs and jitter")
    parser.add_argument(
        "--startup-delay-s",
        type=float,
        default=0.0,
        help="wall seconds to wait before binding and serving: emulates a cold start (a "
        "large model's weight loading) (default 0)",
    )
    sub = parser.add_subparsers(dest="sim_command", metavar="{perf}")
    perf = sub.add_parser("perf", help="print the timing model's figures as one JSON object")
    _add_preset_arguments(perf)
    perf.add_argument("--prefill", type=int, default=8192, help="new prompt tokens (default 8192)")
    perf.add_argument("--cached", type=int, default=0, help="cached prompt tokens (default 0)")
    perf.add_argument("--batch", type=int, default=80, help="decode batch size (default 80)")
    perf.add_argument(
        "--context", type=int, default=1800, help="tokens per decoding sequence (default 1800)"
    )


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
        max_running_requests=getattr(args, "max_running_requests", None),
        kv_capacity_tokens=getattr(args, "kv_capacity_tokens", None),
        mem_fraction_static=getattr(args, "mem_fraction_static", None),
        speedup=getattr(args, "speedup", 1.0),
        instant=getattr(args, "instant", False),
        seed=getattr(args, "seed", 0),
        served_model_name=getattr(args, "served_model_name", None),
        tokenizer_revision=getattr(args, "tokenizer_revision", None),
        schedule_policy=getattr(args, "schedule_policy", "fcfs"),
        max_queued_requests=getattr(args, "max_queued_requests", None),
        stream_interval=getattr(args, "stream_interval", 1),
        jitter=getattr(args, "jitter", 0.0),
        final_tokens=getattr(args, "final_tokens", "chunk_and_complete"),
        grammar_backend=getattr(args, "grammar_backend", "simulated"),
        tool_call_share=getattr(args, "tool_call_share", 1.0),
    )


def perf_figures(args: argparse.Namespace) -> dict[str, object]:
    """The `homing sim perf` object for `args`; raises ValueError on bad input."""
    config = config_from_args(args)
    for name in ("prefill", "cached", "batch", "context"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(args, name)}")
    timing = TimingModel.from_names(config.model, config.gpu, config.tp)
    limits = resolve_limits(
        timing, page_size=config.page_size, mem_fraction_static=config.mem_fraction_static
    )
    prefill_s = timing.prefill_time_s(
        args.prefill, args.cached, chunk_tokens=config.chunked_prefill_size
    )
    return {
        "model": config.model,
        "gpu": timing.gpu.name,
        "tp": config.tp,
        "prefill_tokens": args.prefill,
        "cached_tokens": args.cached,
        "batch": args.batch,
        "context_tokens": args.context,
        "prefill_ms": round(prefill_s * 1e3, 3),
        "prefill_tokens_per_s": round(args.prefill / prefill_s, 1) if prefill_s else 0.0,
        "decode_step_ms": round(timing.decode_step_time_s(args.batch, args.context) * 1e3, 3),
        "kv_capacity_tokens": limits.kv_capacity_tokens,
    }


def run_sim(args: argparse.Namespace) -> int:
    """Run `homing sim` until SIGINT/SIGTERM (or `homing sim perf`); returns the exit code
    (0, 1 when every worker crashed, 2 on bad input)."""
    if getattr(args, "sim_command", None) == "perf":
        try:
            figures = perf_figures(args)
        except ValueError as exc:
            print(f"homing sim perf: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(figures))
        return 0
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
        )
    if args.parent_pid is not None and not exit_with_parent(args.parent_pid):
        return 1
    crashed = asyncio.Event()
    try:
        config = config_from_args(args)
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        delay_s = getattr(args, "startup_delay_s", 0.0)
        if not 0 <= delay_s < float("inf"):
            raise ValueError(f"--startup-delay-s must be a finite number >= 0, got {delay_s}")
        workers: list[SimWorker] = []

        def on_crash(worker: SimWorker) -> None:
            if all(w.crashed for w in workers):
                crashed.set()

        workers.extend(
            SimWorker(
                config,
                host=args.host,
                port=args.port + 2 * i if args.port else 0,
                on_crash=on_crash,
            )
            for i in range(args.workers)
        )
    except ValueError as exc:
        print(f"homing sim: {exc}", file=sys.stderr)
        return 2
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_serve(workers, crashed, delay_s))


async def _serve(workers: list[SimWorker], crashed: asyncio.Event, delay_s: float = 0.0) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started: list[SimWorker] = []
    try:
        if delay_s > 0:  # the emulated cold start; SIGINT / SIGTERM still stop it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await stop.wait()
            if stop.is_set():
                log.info("stopped during the startup delay")
                return 0
        try:
            for worker in workers:
                await worker.start()
                started.append(worker)
        except RuntimeError as exc:
            print(f"homing sim: {exc}", file=sys.stderr)
            return 2
        ready = {
            "event": "ready",
            "workers": [
                {"url": w.url, "port": w.port, "metrics_port": w.metrics_port} for w in started
            ],
        }
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()
        first = started[0]
        log.info(
            "serving %d simulated worker(s): %s on %s x%d, KV pool %d tokens, "
            "max running %d, speedup %g%s",
            len(started),
            first.config.model,
            first.timing.gpu.name,
            first.config.tp,
            first.limits.kv_capacity_tokens,
            first.limits.max_running_requests,
            first.config.speedup,
            ", instant (zero-time steps)" if first.config.instant else "",
        )
        stopping = asyncio.ensure_future(stop.wait())
        crashing = asyncio.ensure_future(crashed.wait())
        pacer = asyncio.ensure_future(_gc_pacer())
        await asyncio.wait({stopping, crashing}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stopping, crashing, pacer):
            task.cancel()
        if crashed.is_set():
            log.info("every worker crashed; exiting")
            return 1
        log.info("stopping")
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await asyncio.gather(*(w.stop() for w in started), return_exceptions=True)


async def _gc_pacer() -> None:
    """Keep full garbage collections from stalling the workers (see the module docstring)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)
    while True:
        await asyncio.sleep(GC_FREEZE_INTERVAL_S)
        gc.collect(1)
        gc.freeze()
