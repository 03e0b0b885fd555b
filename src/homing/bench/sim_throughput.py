"""How fast a `homing sim` process can run: replay a trace against N simulated workers at
`--speedup K` and check that the process keeps up with its own clock.

Rule of this file: a benchmark driver, outside the simulator (it imports `homing.sim` only
for the child process and the metric scrape; the simulator never imports it). It starts
`python -m homing sim --workers N --model M --speedup K --port 0` as a child process, then
acts as the gateway would: subscribes to every worker's KV events (as the router does) and
sends the trace's requests over gRPC at their arrival times / K (streamed, prompt token ids
from `homing.bench.traces.PromptBuilder`, `max_new_tokens` = the trace's output length with
ignore_eos), each to the worker its conversation went to before (`--routing affinity`: the
request's second Mooncake block id, which a conversation's later turns repeat, modulo N; the
first block is the prompt every request shares), or round-robin. After `--duration-s` wall
seconds it reads every worker's `/metrics`:

    slip share = sum(homing_sim_slip_wall_seconds) / (workers x measured wall seconds)

over the measured window (after `--warmup-s`): the share of each worker's time whose simulated
progress was lost because the process could not keep up with its own clock (see
`homing.sim.engine_loop`). It also reports the mean lag of a step's end behind its deadline, in
wall and in simulated milliseconds (how late tokens are handed out), and the sim process's CPU
use. A trial keeps up when the slip share is at most `--max-slip-share` (default 1%), no request
failed, and the load generator itself sent its requests on time (p99 send lag under 1 s).
`--speedup` may be repeated; `--search` goes on from the last one in steps of SEARCH_STEP (x1.25)
until a trial falls behind, and the largest speedup that kept up is reported.

Usage:
    python -m homing.bench.sim_throughput \\
        --trace ../shared/traces/mooncake/conversation_trace.jsonl \\
        --workers 8 --model llama-3.1-70b --speedup 10 [--search] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass

import aiohttp
import grpc
import uvloop
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.bench.traces import PromptBuilder, TraceRequest, load_trace
from homing.sim.metrics import scrape_total
from homing.sim.process import spawn_sim, terminate

SEARCH_STEP = 1.25
"""`--search` multiplies the speedup by this after every trial that kept up."""

MAX_SEND_LAG_S = 1.0
"""A trial whose load generator sent its p99 request later than this is not valid."""


@dataclass(frozen=True)
class TrialResult:
    """One trial at one speedup (wall seconds unless stated)."""

    speedup: float
    workers: int
    model: str
    duration_s: float
    requests_sent: int
    requests_completed: int
    request_errors: int
    tokens_received: int
    kv_event_batches: int
    modeled_wall_s: float
    busy_share: float
    slip_wall_s: float
    slip_share: float
    mean_lag_wall_ms: float
    mean_lag_sim_ms: float
    max_lag_wall_s: float
    send_lag_p99_s: float
    sim_cpu_share: float
    kept_up: bool


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), in seconds; 0 where unavailable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass(frozen=True)
class _Sample:
    modeled: float = 0.0
    lag: float = 0.0
    slip: float = 0.0
    steps: float = 0.0
    max_lag: float = 0.0


async def _metrics(http: aiohttp.ClientSession, ports: list[int]) -> _Sample:
    modeled = lag = slip = steps = worst = 0.0
    for port in ports:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
        modeled += scrape_total(text, "homing_sim_modeled_wall_seconds_total")
        lag += scrape_total(text, "homing_sim_lag_wall_seconds_total")
        slip += scrape_total(text, "homing_sim_slip_wall_seconds_total")
        steps += scrape_total(text, "homing_sim_steps_total")
        worst = max(worst, scrape_total(text, "homing_sim_max_lag_wall_seconds"))
    return _Sample(modeled, lag, slip, steps, worst)


async def run_trial(
    requests: list[TraceRequest],
    *,
    speedup: float,
    workers: int,
    model: str,
    duration_s: float,
    warmup_s: float,
    max_slip_share: float,
    subscribe: bool = True,
    routing: str = "affinity",
) -> TrialResult:
    """Start a sim process, replay `requests` at `speedup` for `duration_s` wall seconds, and
    measure (see the module docstring). Raises RuntimeError when the sim does not start."""
    process, ready = await spawn_sim(
        ["--workers", str(workers), "--model", model, "--speedup", str(speedup), "--port", "0"],
        stderr=asyncio.subprocess.DEVNULL,
        timeout_s=60,
    )
    try:
        ports = [w["port"] for w in ready["workers"]]
        metrics_ports = [w["metrics_port"] for w in ready["workers"]]
        return await _drive(
            requests,
            process.pid,
            ports,
            metrics_ports,
            speedup=speedup,
            model=model,
            duration_s=duration_s,
            warmup_s=warmup_s,
            max_slip_share=max_slip_share,
            subscribe=subscribe,
            routing=routing,
        )
    finally:
        await terminate([process], grace_s=15)


async def _drive(
    requests: list[TraceRequest],
    pid: int,
    ports: list[int],
    metrics_ports: list[int],
    *,
    speedup: float,
    model: str,
    duration_s: float,
    warmup_s: float,
    max_slip_share: float,
    subscribe: bool,
    routing: str,
) -> TrialResult:
    loop = asyncio.get_running_loop()
    builder = PromptBuilder()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for port in ports]
    stubs = [pb_grpc.SglangSchedulerStub(channel) for channel in channels]
    counts = {"completed": 0, "errors": 0, "tokens": 0, "batches": 0}
    lags: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def send(request: TraceRequest, stub: pb_grpc.SglangSchedulerStub) -> None:
        message = pb.GenerateRequest(
            request_id=f"trace-{request.index}",
            tokenized=pb.TokenizedInput(input_ids=builder.prompt_ids(request)),
            sampling_params=pb.SamplingParams(
                temperature=0, max_new_tokens=request.output_tokens, ignore_eos=True
            ),
            stream=True,
        )
        try:
            async for response in stub.Generate(message):
                if response.HasField("chunk"):
                    counts["tokens"] += len(response.chunk.token_ids)
            counts["completed"] += 1
        except grpc.aio.AioRpcError:
            counts["errors"] += 1

    async def events(stub: pb_grpc.SglangSchedulerStub) -> None:
        call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=0))
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for _ in call:
                counts["batches"] += 1

    subscribers = [asyncio.create_task(events(stub)) for stub in stubs] if subscribe else []
    async with aiohttp.ClientSession() as http:
        start = loop.time()
        measured = False
        base = _Sample()
        cpu_start = 0.0
        measure_start = start
        sent = 0
        for request in requests:
            due = start + request.arrival_s / speedup
            if due - start > duration_s:
                break
            if not measured and due - start >= warmup_s:
                base = await _metrics(http, metrics_ports)
                cpu_start = _cpu_seconds(pid)
                measure_start = loop.time()
                measured = True
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(max(loop.time() - due, 0.0))
            task = asyncio.create_task(
                send(request, stubs[_route(request, sent, len(stubs), routing)])
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        remaining = start + duration_s - loop.time()
        if remaining > 0:
            await asyncio.sleep(remaining)
        if not measured:
            base = _Sample()
            cpu_start = 0.0
            measure_start = start
        end = await _metrics(http, metrics_ports)
        cpu_end = _cpu_seconds(pid)
        window = loop.time() - measure_start
    for task in list(tasks) + subscribers:
        task.cancel()
    await asyncio.gather(*tasks, *subscribers, return_exceptions=True)
    for channel in channels:
        await channel.close()
    modeled = end.modeled - base.modeled
    slip = end.slip - base.slip
    steps = end.steps - base.steps
    lag_mean = (end.lag - base.lag) / steps if steps else 0.0
    share = slip / (window * len(ports)) if window > 0 else 0.0
    lags.sort()
    lag_p99 = lags[min(int(0.99 * len(lags)), len(lags) - 1)] if lags else 0.0
    return TrialResult(
        speedup=speedup,
        workers=len(ports),
        model=model,
        duration_s=duration_s,
        requests_sent=sent,
        requests_completed=counts["completed"],
        request_errors=counts["errors"],
        tokens_received=counts["tokens"],
        kv_event_batches=counts["batches"],
        modeled_wall_s=round(modeled, 3),
        busy_share=round(modeled / (window * len(ports)), 3) if window > 0 else 0.0,
        slip_wall_s=round(slip, 3),
        slip_share=round(share, 4),
        mean_lag_wall_ms=round(lag_mean * 1e3, 3),
        mean_lag_sim_ms=round(lag_mean * 1e3 * speedup, 2),
        max_lag_wall_s=round(end.max_lag, 4),
        send_lag_p99_s=round(lag_p99, 4),
        sim_cpu_share=round((cpu_end - cpu_start) / window, 3) if window > 0 else 0.0,
        kept_up=share <= max_slip_share and lag_p99 <= MAX_SEND_LAG_S and counts["errors"] == 0,
    )


def _route(request: TraceRequest, sent: int, workers: int, routing: str) -> int:
    """The worker index for `request` (see the module docstring)."""
    if routing == "affinity" and request.hash_ids:
        key = request.hash_ids[1] if len(request.hash_ids) > 1 else request.hash_ids[0]
        return key % workers
    return sent % workers


def build_parser() -> argparse.ArgumentParser:
    """The options of `python -m homing.bench.sim_throughput`."""
    parser = argparse.ArgumentParser(
        prog="python -m homing.bench.sim_throughput", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--trace", required=True, help="Mooncake jsonl or Azure csv trace")
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--workers", type=int, default=8, help="workers in the sim process")
    parser.add_argument("--model", default="llama-3.1-70b", help="model preset")
    parser.add_argument(
        "--speedup", type=float, action="append", help="speedup to try (repeatable; default 10)"
    )
    parser.add_argument(
        "--search", action="store_true", help="raise the speedup x1.25 until a trial falls behind"
    )
    parser.add_argument("--duration-s", type=float, default=60.0, help="wall seconds per trial")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="unmeasured wall seconds")
    parser.add_argument(
        "--max-slip-share", type=float, default=0.01, help="keep-up threshold (default 0.01)"
    )
    parser.add_argument("--no-subscribe", action="store_true", help="do not subscribe to KV events")
    parser.add_argument(
        "--routing", choices=("affinity", "round_robin"), default="affinity", help="see above"
    )
    parser.add_argument("--json", default=None, help="write the trials here as JSON")
    return parser


async def _main(args: argparse.Namespace) -> int:
    requests = load_trace(args.trace, limit=args.limit)
    speedups = list(args.speedup or [10.0])
    results: list[TrialResult] = []
    index = 0
    while index < len(speedups):
        result = await run_trial(
            requests,
            speedup=speedups[index],
            workers=args.workers,
            model=args.model,
            duration_s=args.duration_s,
            warmup_s=args.warmup_s,
            max_slip_share=args.max_slip_share,
            subscribe=not args.no_subscribe,
            routing=args.routing,
        )
        results.append(result)
        print(json.dumps(asdict(result)), flush=True)
        if args.search and result.kept_up and index == len(speedups) - 1:
            speedups.append(round(speedups[index] * SEARCH_STEP, 2))
        index += 1
    kept = [r.speedup for r in results if r.kept_up]
    summary = {
        "largest_speedup_kept_up": max(kept) if kept else None,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
        "trials": [asdict(r) for r in results],
    }
    print(json.dumps({"largest_speedup_kept_up": summary["largest_speedup_kept_up"]}))
    if args.json:
        await asyncio.to_thread(_write_json, args.json, summary)
    return 0


def _write_json(path: str, data: object) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    return uvloop.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
