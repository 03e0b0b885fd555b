"""`homing bench`: replay a trace against a running gateway and report TTFT, TPOT, goodput.

Rule of this file: the command-line edge. It checks arguments (exit 2 with a clear message),
loads the trace, runs the load generator under uvloop, prints the summary table to stdout,
writes `--json OUT` and, with `--plot DIR`, the PNGs of `homing.bench.plots`. Exit codes: 0
when the run finished (even if requests failed; the table lists them), 1 when the gateway
cannot be reached, 2 for bad arguments, an unreadable trace or an unwritable output, 130 when
interrupted (SIGINT/SIGTERM; the partial summary is still printed and written).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from homing.bench.loadgen import GatewayError, LoadConfig, fetch_model_id, run_load
from homing.bench.records import RequestRecord
from homing.bench.report import (
    DEFAULT_SLO_TPOT_MS,
    DEFAULT_SLO_TTFT_MS,
    Slo,
    format_summary,
    summarize,
)
from homing.bench.traces import (
    DEFAULT_VOCAB_LIMIT,
    DEFAULT_VOCAB_LOW,
    PromptBuilder,
    TraceFormatError,
    TraceRequest,
    load_trace,
    trace_format,
)

DEFAULT_URL = "http://127.0.0.1:8080"
EXIT_OK = 0
EXIT_GATEWAY = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `homing bench` options to `parser`."""
    parser.add_argument(
        "--trace",
        required=True,
        metavar="PATH",
        help="trace file: .jsonl = Mooncake (hash_ids give shared prefixes), .csv = Azure",
    )
    parser.add_argument("--url", default=DEFAULT_URL, help=f"gateway base URL ({DEFAULT_URL})")
    parser.add_argument(
        "--model", default=None, help="model id (default: first id from GET /v1/models)"
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="time compression: arrivals at trace timestamp / SPEED (default 1.0)",
    )
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="replay only the first N requests"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=256,
        help="most requests in flight; later arrivals queue for a slot (default 256)",
    )
    parser.add_argument(
        "--slo-ttft-ms",
        type=float,
        default=DEFAULT_SLO_TTFT_MS,
        help=f"TTFT SLO in ms for goodput (default {DEFAULT_SLO_TTFT_MS:g})",
    )
    parser.add_argument(
        "--slo-tpot-ms",
        type=float,
        default=DEFAULT_SLO_TPOT_MS,
        help=f"TPOT SLO in ms for goodput (default {DEFAULT_SLO_TPOT_MS:g})",
    )
    parser.add_argument(
        "--json", default=None, metavar="OUT", help="write the summary as JSON to OUT"
    )
    parser.add_argument(
        "--plot",
        default=None,
        metavar="DIR",
        help=(
            "write TTFT/TPOT CDFs, throughput and goodput, per-worker load and cache hit rate "
            "over time as PNGs into DIR (created)"
        ),
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=600.0,
        help="per-request limit from send to end of stream, seconds (default 600)",
    )
    parser.add_argument(
        "--vocab-limit",
        type=int,
        default=DEFAULT_VOCAB_LIMIT,
        help=(
            f"synthetic prompt token ids lie in [{DEFAULT_VOCAB_LOW}, VOCAB_LIMIT); keep it "
            f"<= the model's vocabulary size (default {DEFAULT_VOCAB_LIMIT})"
        ),
    )
    parser.add_argument(
        "--api-key", default=None, help="sent as 'Authorization: Bearer KEY' when given"
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="do not draw the progress bar on stderr"
    )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long, say
        return False


def _argument_problems(args: argparse.Namespace) -> list[str]:
    problems: list[str] = []
    trace = Path(args.trace)
    if not _is_file(trace):
        problems.append(f"trace file not found: {args.trace}")
    else:
        try:
            trace_format(trace)
        except TraceFormatError as e:
            problems.append(str(e))
    if not (math.isfinite(args.speed) and args.speed > 0):
        problems.append(f"--speed must be a finite number > 0, got {args.speed}")
    if args.limit is not None and args.limit < 1:
        problems.append(f"--limit must be >= 1, got {args.limit}")
    if args.concurrency < 1:
        problems.append(f"--concurrency must be >= 1, got {args.concurrency}")
    for name in ("slo_ttft_ms", "slo_tpot_ms", "timeout_s"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            problems.append(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
    plot = getattr(args, "plot", None)
    if plot is not None:
        try:
            Path(plot).mkdir(parents=True, exist_ok=True)  # refused now, not after the run
        except OSError as err:
            problems.append(f"--plot {plot}: cannot make that directory ({err.strerror})")
    if args.vocab_limit <= DEFAULT_VOCAB_LOW:
        problems.append(f"--vocab-limit must be > {DEFAULT_VOCAB_LOW}, got {args.vocab_limit}")
    return problems


async def bench(
    args: argparse.Namespace, requests: Sequence[TraceRequest], builder: PromptBuilder
) -> tuple[dict[str, Any], list[RequestRecord]]:
    """Run the replay described by `args`; return the summary (see `report.summarize`) and the
    records it was computed from.

    SIGINT/SIGTERM stop it early (`interrupted: true`). Raises GatewayError when `--model` is
    not given and `GET /v1/models` fails.
    """
    api_key = getattr(args, "api_key", None)
    model = args.model or await fetch_model_id(args.url, api_key=api_key)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    config = LoadConfig(
        url=args.url,
        model=model,
        speed=args.speed,
        concurrency=args.concurrency,
        timeout_s=args.timeout_s,
        api_key=api_key,
        progress=not getattr(args, "no_progress", False),
    )
    try:
        records = await run_load(requests, builder, config, stop=stop)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    meta = {
        "trace": str(args.trace),
        "format": trace_format(args.trace),
        "model": model,
        "url": args.url,
        "speed": args.speed,
        "limit": args.limit,
        "concurrency": args.concurrency,
        "timeout_s": args.timeout_s,
        "vocab_limit": builder.vocab_limit,
        "started_at": started_at,
        "interrupted": stop.is_set(),
        "trace_requests": len(requests),
    }
    slo = Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)
    return summarize(records, slo=slo, meta=meta), records


def write_json(summary: dict[str, Any], out: str | Path) -> None:
    """Write `summary` as indented JSON to `out`, creating parent directories."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of `homing bench` (parsed by `add_bench_arguments`); returns the exit code."""
    problems = _argument_problems(args)
    if problems:
        for p in problems:
            print(f"homing bench: error: {p}", file=sys.stderr)
        return EXIT_USAGE
    try:
        requests = load_trace(args.trace, limit=args.limit)
    except (TraceFormatError, OSError) as e:
        print(f"homing bench: error: cannot read trace: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not requests:
        print(f"homing bench: error: {args.trace} holds no requests", file=sys.stderr)
        return EXIT_USAGE
    builder = PromptBuilder(vocab_limit=args.vocab_limit)
    try:
        summary, records = uvloop.run(bench(args, requests, builder))
    except GatewayError as e:
        print(f"homing bench: error: {e}", file=sys.stderr)
        return EXIT_GATEWAY
    print(format_summary(summary), flush=True)
    if args.json:
        try:
            write_json(summary, args.json)
        except OSError as e:
            print(f"homing bench: error: cannot write {args.json}: {e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"wrote {args.json}", file=sys.stderr)
    if getattr(args, "plot", None):
        from homing.bench.plots import write_plots  # matplotlib only when asked for

        slo = Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)
        title = f"homing bench {Path(args.trace).name} ({summary['model']}, speed {args.speed:g})"
        try:
            paths = write_plots(records, args.plot, slo, title=title)
        except OSError as e:
            print(f"homing bench: error: cannot write plots to {args.plot}: {e}", file=sys.stderr)
            return EXIT_USAGE
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
    return EXIT_INTERRUPTED if summary["interrupted"] else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone `python -m homing.bench.main ...` (the `homing` CLI wires `run_bench`)."""
    parser = argparse.ArgumentParser(prog="homing bench", description=__doc__.splitlines()[0])
    add_bench_arguments(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
