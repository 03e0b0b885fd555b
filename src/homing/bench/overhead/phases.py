"""The load of `make bench-overhead`, phase by phase: a CPU phase (requests at a concurrency,
the gateway's and the workers' CPU around them), a requests/s phase (wrk, or an aiohttp
closed loop where wrk is missing) and a first-byte phase (turns at concurrency 1, each one
request to every target); the failed requests, counted by target.

Rule of this file: generating the load and reading the CPU clocks around it; which phases a
round runs and in what order is `runner`.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from homing.bench.overhead.client import Client
from homing.bench.overhead.procfs import stat_cpu_seconds
from homing.bench.overhead.targets import DIRECT, GRPC_FLOOR
from homing.bench.overhead.workload import NON_STREAMED_TOKENS, RPS_CONCURRENCY
from homing.bench.report import percentile


@dataclass
class Errors:
    """Failed requests by target: a count and the first few distinct messages."""

    counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, target: str, message: str) -> None:
        self.counts[target] = self.counts.get(target, 0) + 1
        seen = self.samples.setdefault(target, [])
        if message not in seen and len(seen) < 5:
            seen.append(message)


async def cpu_phase(
    client: Client,
    errors: Errors,
    target: str,
    max_tokens: int,
    stream: bool,
    requests: int,
    concurrency: int,
) -> dict[str, float]:
    """`requests` requests at `concurrency`: gateway and workers' CPU per good request (ms).
    For GRPC_FLOOR the "gateway" is the floor's child, its CPU from its own process clock
    over the calls alone, and "messages_per_call" is added."""
    stack = client.stack
    if target == GRPC_FLOOR:
        return await _floor_cpu_phase(client, errors, max_tokens, stream, requests, concurrency)
    pids = stack.gateway_pids(target)
    remaining, good = requests, 0

    async def worker() -> None:
        nonlocal remaining, good
        while remaining > 0:
            remaining -= 1
            _, error = await client.request(target, max_tokens, stream)
            if error is None:
                good += 1
            else:
                errors.add(target, error)

    gateway0, ticks0 = stack.gateway_cpu_s(pids)
    workers0, wall0 = stack.worker_cpu_s(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - wall0
    gateway1, ticks1 = stack.gateway_cpu_s(pids)
    gateway, ticks = gateway1 - gateway0, ticks1 - ticks0
    workers = stack.worker_cpu_s() - workers0
    per = max(good, 1)
    return {
        "requests": good,
        "errors": requests - good,
        "wall_s": round(wall, 3),
        "gateway_cpu_ms": round(gateway * 1e3 / per, 4),
        "gateway_cpu_ms_from_ticks": round(ticks * 1e3 / per, 4),
        "workers_cpu_ms": round(workers * 1e3 / per, 4),
    }


async def _floor_cpu_phase(
    client: Client, errors: Errors, max_tokens: int, stream: bool, requests: int,
    concurrency: int,
) -> dict[str, float]:  # fmt: skip
    stack = client.stack
    assert stack.floor is not None
    pid = stack.floor.proc.pid
    ticks0, workers0 = stat_cpu_seconds(pid), stack.worker_cpu_s()
    result = await stack.floor.phase(max_tokens, stream, requests, concurrency)
    ticks, workers = stat_cpu_seconds(pid) - ticks0, stack.worker_cpu_s() - workers0
    for message in result["error_samples"]:
        errors.add(GRPC_FLOOR, message)
    if result["errors"] > len(result["error_samples"]):  # the rest, counted
        errors.counts[GRPC_FLOOR] += result["errors"] - len(result["error_samples"])
    good = result["good"]
    per = max(good, 1)
    return {
        "requests": good,
        "errors": result["errors"],
        "wall_s": round(result["wall_s"], 3),
        "gateway_cpu_ms": round(result["cpu_s"] * 1e3 / per, 4),
        "gateway_cpu_ms_from_ticks": round(ticks * 1e3 / per, 4),
        "workers_cpu_ms": round(workers * 1e3 / per, 4),
        "messages_per_call": round(result["messages"] / per, 3),
    }


WRK_SCRIPT = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[BODY]==]
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) good = 0; bad = 0 end
function response(status, headers, body)
  if status == 200 and body:find('"completion_tokens":%s*TOKENS%D') then
    good = good + 1
  else
    bad = bad + 1
  end
end
function done(summary, latency, requests)
  local g, b = 0, 0
  for _, t in ipairs(threads) do g = g + t:get("good"); b = b + t:get("bad") end
  io.write(string.format('WRK {"good": %d, "bad": %d, "duration_us": %d, "socket_errors": %d}\\n',
    g, b, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.timeout))
end
"""
"""wrk's Lua script: POST the body, count 200s whose usage says TOKENS completion tokens."""


async def rps_phase(
    client: Client, errors: Errors, target: str, seconds: float, wrk: str | None, script: Path
) -> dict[str, float]:
    """Closed loop at RPS_CONCURRENCY for `seconds`: good answers per second and the
    gateway's CPU per good answer (ms), by wrk when `wrk` is its path, else aiohttp."""
    stack = client.stack
    pids = stack.gateway_pids(target)
    gateway0, _ = stack.gateway_cpu_s(pids)
    if wrk is not None:
        url = stack.http_urls[target] + "/v1/chat/completions"
        # subprocess.run with close_fds=False spawns by posix_spawn, not fork (the event
        # loop's own spawn forks, while gRPC threads run); our fds are close-on-exec anyway
        argv = [
            wrk, "-t1", f"-c{RPS_CONCURRENCY}", f"-d{seconds:g}s", "--timeout", "10s",
            "-s", str(script), url,
        ]  # fmt: skip
        done = await asyncio.to_thread(
            subprocess.run, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, close_fds=False, timeout=seconds + 60,
        )  # fmt: skip
        out = done.stdout.decode(errors="replace")
        match = re.search(r"^WRK (\{.*\})$", out, re.MULTILINE)
        if done.returncode != 0 or match is None:
            raise RuntimeError(f"wrk failed ({done.returncode}): {out[-500:]}")
        result = json.loads(match.group(1))
        good, wall = result["good"], result["duration_us"] / 1e6
        bad = result["bad"] + result["socket_errors"]
        if bad:
            errors.add(target, f"wrk: {bad} answers not 200 with the right usage")
    else:
        good = bad = 0
        end = time.perf_counter() + seconds
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal good, bad
            while time.perf_counter() < end:
                _, error = await client.request(target, NON_STREAMED_TOKENS, False)
                if error is None:
                    good += 1
                else:
                    bad += 1
                    errors.add(target, error)

        await asyncio.gather(*(worker() for _ in range(RPS_CONCURRENCY)))
        wall = time.perf_counter() - started
    gateway = stack.gateway_cpu_s(pids)[0] - gateway0
    return {
        "requests": good,
        "errors": bad,
        "wall_s": round(wall, 3),
        "rps": round(good / wall, 1),
        "gateway_cpu_ms": round(gateway * 1e3 / max(good, 1), 4),
    }


async def first_byte_phase(
    client: Client, errors: Errors, targets: Sequence[str], stream: bool, requests: int
) -> dict[str, dict[str, float]]:
    """`requests` turns at concurrency 1, each one request to every target (the order
    rotating): first-byte p50/p99 (ms) per target, and added over DIRECT for the others."""
    samples: dict[str, list[float]] = {t: [] for t in targets}
    for turn in range(requests):
        shift = turn % len(targets)
        for target in [*targets[shift:], *targets[:shift]]:
            seconds, error = await client.request(target, NON_STREAMED_TOKENS, stream)
            if error is None:
                samples[target].append(seconds * 1e3)
            else:
                errors.add(target, error)
    out: dict[str, dict[str, float]] = {}
    for target, values in samples.items():
        out[target] = {
            "n": len(values),
            "p50_ms": round(percentile(values, 50) or 0.0, 4),
            "p99_ms": round(percentile(values, 99) or 0.0, 4),
        }
    base = out[DIRECT]
    for target in targets:
        if target != DIRECT:
            out[target]["added_p50_ms"] = round(out[target]["p50_ms"] - base["p50_ms"], 4)
            out[target]["added_p99_ms"] = round(out[target]["p99_ms"] - base["p99_ms"], 4)
    return out
