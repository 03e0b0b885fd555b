"""The command line of `make bench-overhead` (`python -m homing.bench.overhead`): the
options and their checks, then the run, the table on stdout and the `--json` file; given
`_grpc-floor` first, the grpc.aio floor's child instead.

Rule of this file: arguments in, exit status out; the run is `runner`, the table `report`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import uvloop

from homing.bench.overhead.floor import FLOOR_COMMAND, floor_main
from homing.bench.overhead.report import print_table
from homing.bench.overhead.runner import run
from homing.bench.overhead.targets import HOMING_BEFORE, TARGETS


def _targets(text: str) -> frozenset[str]:
    """`--targets`: comma-separated names of TARGETS ("-" read as "_")."""
    names = {name.strip().replace("-", "_") for name in text.split(",") if name.strip()}
    unknown = names - set(TARGETS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown target(s) {sorted(unknown)}; choose from {', '.join(TARGETS)}"
        )
    return frozenset(names)


def build_parser() -> argparse.ArgumentParser:
    """The command-line options (defaults: ~5 minutes on 2 cores, ~6 with homing_before)."""
    from homing.bench import overhead  # the package: its docstring describes the bench

    doc = overhead.__doc__
    p = argparse.ArgumentParser(
        prog="python -m homing.bench.overhead",
        description=doc.splitlines()[0] if doc else None,
    )
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds (default 3)")
    p.add_argument(
        "--cpu-requests", type=int, default=300, help="non-streamed requests per CPU phase"
    )
    p.add_argument(
        "--stream-requests",
        type=int,
        default=128,
        help="streamed requests per CPU phase at 64 tokens (a quarter of it at 256)",
    )
    p.add_argument("--concurrency", type=int, default=8, help="concurrency of the CPU phases")
    p.add_argument("--rps-seconds", type=float, default=5.0, help="seconds per rps phase")
    p.add_argument(
        "--latency-requests", type=int, default=200, help="first-byte turns per round and mode"
    )
    p.add_argument("--warmup", type=int, default=20, help="warm-up requests per target and mode")
    p.add_argument("--no-wrk", action="store_true", help="rps by aiohttp even if wrk is there")
    p.add_argument(
        "--homing-before-src",
        type=Path,
        help="the src directory of an older homing checkout (native modules and stubs built): "
        "adds the homing_before target, `homing serve` run with PYTHONPATH=DIR",
    )
    p.add_argument(
        "--targets",
        type=_targets,
        help=f"comma-separated targets to measure, of {', '.join(TARGETS)} (default: all; "
        "homing_before only with --homing-before-src)",
    )
    p.add_argument(
        "--log-dir", type=Path, default=Path("bench-out/overhead-logs"), help="processes' logs"
    )
    p.add_argument("--json", type=Path, help="write the result here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run, print the table, write `--json` (or, given FLOOR_COMMAND first,
    be the grpc.aio floor's child)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [FLOOR_COMMAND]:
        return floor_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv
    for name in ("rounds", "cpu_requests", "stream_requests", "concurrency", "latency_requests"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    src = args.homing_before_src
    if args.targets is None:
        args.targets = frozenset(t for t in TARGETS if t != HOMING_BEFORE or src is not None)
    if HOMING_BEFORE in args.targets and src is None:
        print("--targets homing_before needs --homing-before-src", file=sys.stderr)
        return 2
    if src is not None:
        args.homing_before_src = src = src.resolve()
        if not (src / "homing" / "__main__.py").is_file():
            print(f"--homing-before-src {src}: no homing/__main__.py there", file=sys.stderr)
            return 2
    try:
        result = uvloop.run(run(args))
    except (asyncio.CancelledError, KeyboardInterrupt):  # SIGTERM / SIGINT: children stopped
        print("homing.bench.overhead: interrupted; every process it started is stopped",
              file=sys.stderr)  # fmt: skip
        return 130
    print_table(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["errors"]["counts"] else 0
