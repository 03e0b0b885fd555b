"""One run of `make bench-overhead`: start the processes, warm every target up, run the
rounds (each phase taking the targets in an order rotated by one each round), stop every
process, and gather the result: settings, medians and ratios, every round's raw figures.

Rule of this file: the order of things; the load is `phases`, the processes `stack`, the
arithmetic over the rounds `report`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from homing.bench.overhead.client import Client
from homing.bench.overhead.phases import (
    WRK_SCRIPT,
    Errors,
    cpu_phase,
    first_byte_phase,
    rps_phase,
)
from homing.bench.overhead.procfs import machine, peak_rss_mib
from homing.bench.overhead.report import summarize
from homing.bench.overhead.stack import Stack
from homing.bench.overhead.targets import (
    BASE_CONFIG,
    DIRECT,
    GATEWAYS,
    GRPC_FLOOR,
    NOMETRICS_CONFIG,
    STREAM_INTERVALS,
    STREAMED_ONLY,
    TARGETS,
)
from homing.bench.overhead.workload import (
    NON_STREAMED_TOKENS,
    RPS_CONCURRENCY,
    STREAMED_TOKENS,
    chat_body,
)


def _rotated(items: Sequence[str], index: int) -> list[str]:
    """`items` starting at position `index` (mod their count), wrapping round."""
    if not items:
        return []
    shift = index % len(items)
    return [*items[shift:], *items[:shift]]


async def run_round(
    client: Client, errors: Errors, args: argparse.Namespace, index: int, wrk: str | None,
    script: Path,
) -> dict[str, Any]:  # fmt: skip
    """One round of every phase, each taking the selected targets in an order rotated by
    `index` (with homing and smg only: smg first in odd rounds)."""
    selected = [t for t in TARGETS if t in args.targets]
    order = _rotated(selected, index)
    out: dict[str, Any] = {"round": index, "order": order}
    phases: list[tuple[str, int, bool, int]] = [
        ("non_streamed", NON_STREAMED_TOKENS, False, args.cpu_requests),
        *(
            (f"streamed_{n}", n, True, max(1, args.stream_requests * STREAMED_TOKENS[0] // n))
            for n in STREAMED_TOKENS
        ),
    ]
    for name, tokens, stream, requests in phases:
        out[name] = {}
        for target in order:
            if stream or target not in STREAMED_ONLY:
                out[name][target] = await cpu_phase(
                    client, errors, target, tokens, stream, requests, args.concurrency
                )
    low, high = STREAMED_TOKENS
    out["cpu_us_per_streamed_token"] = {
        target: round(
            (
                out[f"streamed_{high}"][target]["gateway_cpu_ms"]
                - out[f"streamed_{low}"][target]["gateway_cpu_ms"]
            )
            * 1e3
            / (high - low),
            3,
        )
        for target in order
    }
    if GRPC_FLOOR in order:
        hi, lo = out[f"streamed_{high}"][GRPC_FLOOR], out[f"streamed_{low}"][GRPC_FLOOR]
        messages = hi["messages_per_call"] - lo["messages_per_call"]
        out["cpu_us_per_streamed_message"] = {
            GRPC_FLOOR: round((hi["gateway_cpu_ms"] - lo["gateway_cpu_ms"]) * 1e3 / messages, 3)
            if messages > 0
            else None
        }
    out["rps"] = {}
    for target in order:
        if target in GATEWAYS:
            out["rps"][target] = await rps_phase(
                client, errors, target, args.rps_seconds, wrk, script
            )
    requesters = [t for t in order if t != GRPC_FLOOR]
    out["first_byte_non_streamed"] = await first_byte_phase(
        client, errors, [DIRECT, *(t for t in requesters if t not in STREAMED_ONLY)], False,
        args.latency_requests,
    )  # fmt: skip
    out["first_byte_streamed"] = await first_byte_phase(
        client, errors, [DIRECT, *requesters], True, args.latency_requests
    )
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, run the rounds, stop everything; the result as a JSON-able dict."""
    stack = Stack(log_dir=args.log_dir, targets=args.targets, before_src=args.homing_before_src)
    errors = Errors()
    wrk = None if args.no_wrk else shutil.which("wrk")
    rounds: list[dict[str, Any]] = []
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)  # so `finally` stops the children
    started = time.monotonic()
    try:
        await stack.start()
        client = Client(stack)
        script = stack.log_dir / "wrk-post.lua"
        body = json.dumps(chat_body(stack.model, NON_STREAMED_TOKENS, False))
        script.write_text(
            WRK_SCRIPT.replace("BODY", body).replace("TOKENS", str(NON_STREAMED_TOKENS))
        )
        for target in (*(t for t in TARGETS if t in args.targets), DIRECT):  # warm-up
            for stream in (False, True):
                if target == GRPC_FLOOR:
                    warm = await cpu_phase(
                        client, errors, target, NON_STREAMED_TOKENS, stream, args.warmup, 1
                    )
                    if warm["errors"]:
                        raise RuntimeError(f"{target} fails at warm-up: {errors.samples}")
                    continue
                for _ in range(args.warmup):
                    _, error = await client.request(target, NON_STREAMED_TOKENS, stream)
                    if error is not None:
                        raise RuntimeError(f"{target} fails at warm-up: {error}")
        for index in range(args.rounds):
            rounds.append(await run_round(client, errors, args, index, wrk, script))
            print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        rss = {  # a target of several processes: their sum
            name: sum(peak_rss_mib(p) for p in stack.gateway_pids(name)) for name in stack.procs
        }
        if stack.floor is not None:
            rss[GRPC_FLOOR] = peak_rss_mib(stack.floor.proc.pid)
        rss["workers"] = max(peak_rss_mib(p.pid) for p in stack.sims)
    finally:
        await stack.stop()
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGTERM)
    summary = summarize(rounds, rss)
    return {
        "command": " ".join(["python -m homing.bench.overhead", *args.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "python": platform.python_version(),
        "wall_s": round(time.monotonic() - started, 1),
        "settings": {
            "rounds": args.rounds,
            "targets": [t for t in TARGETS if t in args.targets],
            "homing_before_src": str(args.homing_before_src) if args.homing_before_src else None,
            "homing_before_commit": _git_commit(args.homing_before_src),
            "stream_intervals": STREAM_INTERVALS,
            "base_config": BASE_CONFIG,
            "nometrics_config": NOMETRICS_CONFIG,
            "cpu_requests": args.cpu_requests,
            "stream_requests_at_64": args.stream_requests,
            "concurrency": args.concurrency,
            "rps_seconds": args.rps_seconds,
            "rps_concurrency": RPS_CONCURRENCY,
            "rps_generator": "wrk" if wrk else "aiohttp",
            "latency_requests": args.latency_requests,
            "prompt_tokens": len(stack.prompt_ids),
            "non_streamed_tokens": NON_STREAMED_TOKENS,
            "streamed_tokens": list(STREAMED_TOKENS),
            "workers": stack.worker_urls,
        },
        **summary,
        "peak_rss_mib": rss,
        "errors": {"counts": errors.counts, "samples": errors.samples},
        "rounds": rounds,
    }


def _git_commit(src: Path | None) -> str | None:
    """The commit checked out above `src` (None without `src` or git)."""
    if src is None:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
        return done.stdout.strip() or None
    return None
