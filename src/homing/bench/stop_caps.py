"""`make bench-stops`: what requests at the stop caps cost a running gateway.

Rule of this file: a measurement, not a test. The gateway runs as its own process (`homing
serve` over simulated workers, which are its children), so the client work of this process
is not in its figures. One run, in order:

- idle: `--probes` back-to-back `GET /health` on one keep-alive connection;
- `--rounds` rounds, each of two loads alternated: `--requests` chat requests of n=16 sent at
  once (half streamed), ~`--max-tokens` tokens per answer with EOS ignored, once without
  stops and once at the caps (4 stops of 1,024 characters each, every request its own,
  built from the answer's text so the matcher holds back up to 1,023 characters and its
  automaton is walked as deep as it goes); `/health` is probed back to back meanwhile.

Reported: `/health` latency p50/p99/max (ms) for idle, without stops and at the caps, and the
gateway process's resident memory (VmRSS, VmHWM from /proc/<pid>/status, MiB) after warm-up,
after the loads without stops and after those at the caps.

    python -m homing.bench.stop_caps --requests 8 --rounds 3 --json bench-out/stop-caps.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from homing.bench.report import percentile
from homing.bench.routers import free_port

# The request caps this load sits at, as README.md's API table documents them for clients: `n` in
# [1, 16], `stop` up to 4 strings of up to 1,024 characters. The bench is a client and keeps its
# own copy; tests/unit/bench/test_bench_stop_caps.py checks it equals the gateway's validation.
MAX_N = 16
MAX_STOP_SEQUENCES = 4
MAX_STOP_LENGTH = 1024

MESSAGES = [{"role": "user", "content": "Tell me a long story"}]


def _summary(values_ms: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50) or 0.0, 3),
        "p99_ms": round(percentile(values_ms, 99) or 0.0, 3),
        "max_ms": round(max(values_ms), 3),
    }


def _memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of process `pid` in MiB, from /proc/<pid>/status."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = round(int(value.split()[0]) / 1024, 1)  # kB
    return out


def cap_stops(answer: str, tag: int) -> list[str]:
    """4 stops of exactly 1,024 characters that follow `answer` for up to 1,023 characters and
    never match it (each ends in a private-use character chosen by `tag`)."""
    end = chr(0xE000 + tag % 6400)
    starts = (0, 1, 400)
    stops = [answer[s : s + MAX_STOP_LENGTH - 1] + end for s in starts]
    stops.append(("ab" * MAX_STOP_LENGTH)[: MAX_STOP_LENGTH - 1] + end)
    if any(len(stop) != MAX_STOP_LENGTH for stop in stops):
        raise SystemExit("the answer is too short for stops at the cap: raise --max-tokens")
    return stops[:MAX_STOP_SEQUENCES]


class Gateway:
    """A `homing serve` child process over simulated workers, on free loopback ports."""

    def __init__(self, workers: int, speedup: float) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "homing", "serve", "--port", str(self.port),
             "--grpc-port", str(free_port()), "--sim-workers", str(workers),
             "--speedup", str(speedup), "--log-level", "warning"],
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the gateway exited with {self.process.returncode}")
            try:
                async with session.get(f"{self.url}/ready") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        raise SystemExit("the gateway did not become ready")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _probe(session: aiohttp.ClientSession, url: str, out: list[float]) -> None:
    started = time.perf_counter()
    async with session.get(f"{url}/health") as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/health answered {resp.status}")
    out.append((time.perf_counter() - started) * 1000)


async def _probe_until(url: str, done: asyncio.Event) -> list[float]:
    out: list[float] = []
    async with aiohttp.ClientSession() as session:
        while not done.is_set():
            await _probe(session, url, out)
    return out


async def _load(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    count: int,
    stops: list[list[str]] | None,
) -> list[float]:
    """Send `count` requests at once (`stops[i]` for the i-th, if given), half of them streamed,
    while probing `/health`; the probe latencies (ms)."""
    done = asyncio.Event()
    probing = asyncio.create_task(_probe_until(url, done))

    async def one(index: int) -> None:
        request = {**body, "stream": index % 2 == 0}
        if stops is not None:
            request["stop"] = stops[index]
        async with session.post(f"{url}/v1/chat/completions", json=request) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"a request answered {resp.status}")

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        done.set()
    return await probing


async def run(
    requests: int, rounds: int, probes: int, max_tokens: int, workers: int, speedup: float
) -> dict[str, Any]:
    """The whole measurement; the result as a JSON-able dict."""
    gateway = Gateway(workers, speedup)
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await gateway.wait_ready(session, 120)
            async with session.get(f"{gateway.url}/v1/models") as resp:
                model = (await resp.json())["data"][0]["id"]
            body: dict[str, Any] = {
                "model": model,
                "messages": MESSAGES,
                "temperature": 0,
                "max_tokens": max_tokens,
                "ignore_eos": True,
            }
            async with session.post(f"{gateway.url}/v1/chat/completions", json=body) as resp:
                answer = (await resp.json())["choices"][0]["message"]["content"]
            load_body = {**body, "n": MAX_N}
            await _load(session, gateway.url, load_body, requests, None)  # warm-up
            memory = {"after_warm_up": _memory_mib(gateway.process.pid)}
            idle: list[float] = []
            for _ in range(probes):
                await _probe(session, gateway.url, idle)
            plain: list[float] = []
            capped: list[float] = []
            for round_ in range(rounds):
                plain += await _load(session, gateway.url, load_body, requests, None)
                memory[f"after_round_{round_}_without_stops"] = _memory_mib(gateway.process.pid)
                stops = [cap_stops(answer, requests * round_ + i + 1) for i in range(requests)]
                capped += await _load(session, gateway.url, load_body, requests, stops)
                memory[f"after_round_{round_}_at_caps"] = _memory_mib(gateway.process.pid)
    finally:
        gateway.stop()
    before = memory["after_warm_up"]["VmRSS"]
    last = rounds - 1
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "params": {
            "requests": requests,
            "n": MAX_N,
            "rounds": rounds,
            "max_tokens": max_tokens,
            "answer_chars": len(answer),
            "stops": f"{MAX_STOP_SEQUENCES} x {MAX_STOP_LENGTH} characters",
            "sim_workers": workers,
            "speedup": speedup,
        },
        "health_idle": _summary(idle),
        "health_without_stops": _summary(plain),
        "health_at_caps": _summary(capped),
        "memory_mib": memory,
        "rss_growth_without_stops_mib": round(
            memory[f"after_round_{last}_without_stops"]["VmRSS"] - before, 1
        ),
        "rss_growth_at_caps_mib": round(memory[f"after_round_{last}_at_caps"]["VmRSS"] - before, 1),
    }


def _table(result: dict[str, Any]) -> str:
    rows = [
        "| /health during | probes | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key in (
        ("idle", "health_idle"),
        ("load without stops", "health_without_stops"),
        ("load at the stop caps", "health_at_caps"),
    ):
        s = result[key]
        rows.append(f"| {label} | {s['n']} | {s['p50_ms']} | {s['p99_ms']} | {s['max_ms']} |")
    rows.append("")
    rows.append("| gateway memory | VmRSS MiB | VmHWM MiB |")
    rows.append("|---|---:|---:|")
    for label, mem in result["memory_mib"].items():
        rows.append(f"| {label.replace('_', ' ')} | {mem['VmRSS']} | {mem['VmHWM']} |")
    rows.append(
        f"\nRSS growth since warm-up: {result['rss_growth_without_stops_mib']} MiB after the "
        f"loads without stops, {result['rss_growth_at_caps_mib']} MiB after those at the caps."
    )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: print the tables, write `--json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=8, help="requests sent at once per load")
    parser.add_argument("--rounds", type=int, default=3, help="loads without and at the caps")
    parser.add_argument("--probes", type=int, default=2000, help="idle /health probes")
    parser.add_argument("--max-tokens", type=int, default=500, help="tokens per answer")
    parser.add_argument("--workers", type=int, default=2, help="simulated workers")
    parser.add_argument("--speedup", type=float, default=10.0, help="simulated clock speedup")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    result = uvloop.run(
        run(args.requests, args.rounds, args.probes, args.max_tokens, args.workers, args.speedup)
    )
    print(_table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
