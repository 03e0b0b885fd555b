"""`python -m homing.bench.autoscale`: "traffic doubles in five minutes; what happens?", run
against an oracle.

Rule of this file: real parts on loopback, figures from what they did. One `App` in this
process with the scaler on (active, local actuator over simulated workers at `--speedup` S,
each waiting `60 / S` wall seconds before it serves: one simulated minute of cold start)
and every time constant of the scaler divided by S; a closed-loop load of streaming
completions whose concurrency follows `Schedule` (steady at C, a linear ramp to 2C over five
minutes, steady at 2C); a sample of the pool every simulated second. All times reported
are simulated seconds (wall x S); TTFT is the client's, from send to the first chunk with
text, times S.

Figures (pure functions of the samples and records, below):
- GPU-seconds: the sum over samples of (ready + warm + starting + draining + ejected) x
  gpus_per_replica x the sample interval. The oracle holds, at each sample, ceil(target
  concurrency / capacity) replicas (no headroom, no cold start, no warm pool), capacity
  being the estimator's final decode streams per replica; the ratio is run / oracle.
- p95 TTFT per window of `--window-s`, requests binned by send time; recovery: from the
  start of the first window from the ramp's start on whose p95 exceeds the SLO to the
  start of the first later window that meets it (0 when none exceeds it; None when it
  never recovers); and how many windows exceeded it, and the last that did.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from matplotlib.figure import Figure

from homing.app import App
from homing.bench.report import percentile
from homing.bench.sse import CompletionStream, SseDecoder
from homing.config import (
    GatewaySettings,
    HomingConfig,
    ObsSettings,
    ScalerSettings,
    SimSettings,
    SloSettings,
)
from homing.obs.logging import configure_logging

#: The seed's cold start: a 70B replica takes a minute or more to load (simulated seconds).
COLD_START_S = 60.0
#: The seed's p95 TTFT target, simulated seconds.
TTFT_SLO_S = 0.5
#: The seed's p95 TPOT target, simulated seconds.
TPOT_SLO_S = 0.05
#: The scaler's defaults (homing.scaler.policy) in simulated seconds: tick, stable window,
#: cooldown.
TICK_S, SCALE_DOWN_WINDOW_S, SCALE_DOWN_COOLDOWN_S = 5.0, 120.0, 60.0
#: Simulated seconds between samples of the pool.
SAMPLE_S = 1.0
#: Wall seconds the initial replicas may take to be ready before the run starts.
READY_TIMEOUT_S = 120.0
#: Wall seconds between checks of the load's concurrency against the schedule.
CONTROL_WALL_S = 0.02


@dataclass(frozen=True)
class Schedule:
    """Target concurrency (streams) over simulated seconds: `base` for `steady_s`, a linear
    ramp to 2 x `base` over `ramp_s`, then 2 x `base` for `hold_s`."""

    base: int
    steady_s: float = 120.0
    ramp_s: float = 300.0
    hold_s: float = 180.0

    @property
    def duration_s(self) -> float:
        return self.steady_s + self.ramp_s + self.hold_s

    def concurrency(self, t: float) -> int:
        """Streams wanted at simulated second `t` (rounded to the nearest)."""
        if t < self.steady_s:
            return self.base
        if t < self.steady_s + self.ramp_s:
            return round(self.base * (1.0 + (t - self.steady_s) / self.ramp_s))
        return 2 * self.base


@dataclass
class Sample:
    """The pool at simulated second `t_s`: replica counts (homing.scaler.loop
    `PoolScaler.counts`), the target concurrency, streams open at the client, and the
    scaler's last decision (desired ready / warm; -1 before the first)."""

    t_s: float
    concurrency: int
    open_streams: int
    ready: int
    warm: int
    starting: int
    draining: int
    ejected: int
    desired_ready: int
    desired_warm: int

    @property
    def held(self) -> int:
        """Replicas holding GPUs."""
        return self.ready + self.warm + self.starting + self.draining + self.ejected


@dataclass
class Request:
    """One streamed completion: sent at `send_s` (simulated s since the start), its TTFT
    (simulated s; None: no token), and the error when it failed (None: completed)."""

    send_s: float
    ttft_s: float | None = None
    error: str | None = None


def oracle_replicas(concurrency: int, capacity: float) -> int:
    """Fewest replicas holding `concurrency` streams at `capacity` streams each (0 for 0)."""
    if concurrency <= 0:
        return 0
    return math.ceil(concurrency / capacity - 1e-9)


def gpu_seconds(held: Sequence[int], gpus_per_replica: int, dt_s: float) -> float:
    """GPU-seconds of replica counts sampled every `dt_s` seconds."""
    return sum(held) * gpus_per_replica * dt_s


@dataclass(frozen=True)
class Window:
    """Requests sent in [start_s, start_s + width): their count and p95 TTFT (simulated s;
    None: no TTFT in it)."""

    start_s: float
    requests: int
    ttft_p95_s: float | None


def ttft_windows(requests: Sequence[Request], width_s: float, duration_s: float) -> list[Window]:
    """p95 TTFT of the completed requests per window of send time over [0, duration_s)."""
    n = math.ceil(duration_s / width_s - 1e-9)
    bins: list[list[float]] = [[] for _ in range(n)]
    for r in requests:
        k = int(r.send_s // width_s)
        if 0 <= k < n and r.ttft_s is not None and r.error is None:
            bins[k].append(r.ttft_s)
    return [Window(k * width_s, len(b), percentile(b, 95.0)) for k, b in enumerate(bins)]


def recovery_s(
    windows: Sequence[Window], slo_s: float, from_s: float = 0.0
) -> tuple[float | None, float | None]:
    """(start of the first window from `from_s` on over `slo_s`, recovery time): 0 recovery
    when no such window exceeds it; recovery None when no later window meets it again.
    Windows without data neither exceed nor meet."""
    first = next(
        (
            w
            for w in windows
            if w.start_s >= from_s and w.ttft_p95_s is not None and w.ttft_p95_s > slo_s
        ),
        None,
    )
    if first is None:
        return None, 0.0
    for w in windows:
        if w.start_s > first.start_s and w.ttft_p95_s is not None and w.ttft_p95_s <= slo_s:
            return first.start_s, w.start_s - first.start_s
    return first.start_s, None


@dataclass
class Load:
    """The closed-loop clients: client i runs while i < the schedule's concurrency, sending
    one streamed completion after another (a unique prompt each, so no cache affinity)."""

    url: str
    model: str
    schedule: Schedule
    speedup: float
    max_tokens: int
    t0: float = 0.0
    requests: list[Request] = field(default_factory=list)
    open_streams: int = 0
    _clients: dict[int, asyncio.Task[None]] = field(default_factory=dict)

    def now_s(self) -> float:
        """Simulated seconds since the start."""
        return (time.monotonic() - self.t0) * self.speedup

    async def run(self) -> None:
        """Follow the schedule until its end, then let every stream finish."""
        self.t0 = time.monotonic()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            while (t := self.now_s()) < self.schedule.duration_s:
                want = self.schedule.concurrency(t)
                for i in range(want):
                    task = self._clients.get(i)
                    if task is None or task.done():
                        self._clients[i] = asyncio.create_task(self._client(http, i))
                await asyncio.sleep(CONTROL_WALL_S)
            await asyncio.gather(*self._clients.values(), return_exceptions=True)

    def _wanted(self, index: int) -> bool:
        t = self.now_s()
        return t < self.schedule.duration_s and index < self.schedule.concurrency(t)

    async def _client(self, http: aiohttp.ClientSession, index: int) -> None:
        while self._wanted(index):
            await self._one(http)

    async def _one(self, http: aiohttp.ClientSession) -> None:
        rec = Request(send_s=self.now_s())
        self.requests.append(rec)
        body = {
            "model": self.model,
            "prompt": f"{uuid.uuid4().hex} tell me a long story about the sea " * 4,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        stream, decoder = CompletionStream(), SseDecoder()
        sent = time.monotonic()
        self.open_streams += 1
        try:
            async with http.post(self.url, json=body) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return
                async for chunk in resp.content.iter_any():
                    received = time.monotonic()
                    for data in decoder.feed(chunk):
                        stream.on_event(data, received)
        except (aiohttp.ClientError, OSError) as err:
            rec.error = f"{type(err).__name__}: {err}"
        finally:
            self.open_streams -= 1
        if rec.error is None:
            problem = stream.verdict()
            rec.error = None if problem is None else problem.message
        if stream.first_token_s is not None:
            rec.ttft_s = (stream.first_token_s - sent) * self.speedup


def build_config(args: argparse.Namespace) -> HomingConfig:
    """The App's config: the scaler's constants divided by `--speedup`, SLOs too."""
    s = args.speedup
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        sim=SimSettings(
            workers=args.initial_replicas,
            model=args.model,
            speedup=s,
            extra_args=[
                "--startup-delay-s",
                f"{COLD_START_S / s:g}",
                "--max-running-requests",
                str(args.max_running),
                "--stream-interval",
                str(args.stream_interval),
            ],
        ),
        slo=SloSettings(ttft_p95_s=TTFT_SLO_S / s, tpot_p95_s=TPOT_SLO_S / s),
        obs=ObsSettings(request_metrics=False),
        scaler=ScalerSettings(
            enabled=True,
            mode="active",
            actuator="local",
            tick_s=TICK_S / s,
            min_replicas=args.initial_replicas,  # the App starts this many
            max_replicas=args.max_replicas,
            decode_streams_per_replica=float(args.max_running),
            scale_down_window_s=SCALE_DOWN_WINDOW_S / s,
            scale_down_cooldown_s=SCALE_DOWN_COOLDOWN_S / s,
            default_cold_start_s=COLD_START_S / s,
            idle_to_zero_s=300.0 / s,
            startup_timeout_s=120.0,
        ),
    )


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the schedule against an App; returns the summary (JSON-ready)."""
    s = args.speedup
    schedule = Schedule(args.concurrency)
    app = App(build_config(args))
    await app.start()
    try:
        assert app.scaler is not None and app.model is not None
        pool = app.scaler.pools[0]
        seed_capacity = pool.estimator.decode_streams
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pool.counts().ready < args.initial_replicas:  # every replica serves at t=0
            if time.monotonic() > deadline:
                raise RuntimeError(f"{args.initial_replicas} replicas not ready in time")
            await asyncio.sleep(0.1)
        load = Load(
            url=f"http://127.0.0.1:{app.http_port}/v1/completions",
            model=app.model.model_id,
            schedule=schedule,
            speedup=s,
            max_tokens=args.max_tokens,
        )
        samples: list[Sample] = []
        runner = asyncio.create_task(load.run())
        await asyncio.sleep(0)
        next_at = 0.0
        while not runner.done():
            t = load.now_s()
            if t >= next_at and t < schedule.duration_s:
                c = pool.counts()
                last = pool.last
                samples.append(
                    Sample(
                        t_s=round(next_at, 3),
                        concurrency=schedule.concurrency(t),
                        open_streams=load.open_streams,
                        ready=c.ready,
                        warm=c.warm,
                        starting=c.starting,
                        draining=c.draining,
                        ejected=c.ejected,
                        desired_ready=last.desired_ready if last else -1,
                        desired_warm=last.desired_warm if last else -1,
                    )
                )
                next_at += SAMPLE_S
            await asyncio.sleep(max(0.0, (next_at - load.now_s()) / s))
        await runner
        capacity = pool.estimator.decode_streams
        gpus = pool.config.gpus_per_replica
        cold = pool.actuator.cold_start_s()
    finally:
        await app.stop()
    return summarize(args, schedule, samples, load.requests, capacity, seed_capacity, gpus, cold)


def summarize(
    args: argparse.Namespace,
    schedule: Schedule,
    samples: Sequence[Sample],
    requests: Sequence[Request],
    capacity: float,
    seed_capacity: float,
    gpus: int,
    cold_start_wall_s: float | None,
) -> dict[str, Any]:
    """The JSON summary of one run (figures: the module docstring)."""
    s = args.speedup
    run_gpu_s = gpu_seconds([x.held for x in samples], gpus, SAMPLE_S)
    oracle = [oracle_replicas(x.concurrency, capacity) for x in samples]
    oracle_gpu_s = gpu_seconds(oracle, gpus, SAMPLE_S)
    windows = ttft_windows(requests, args.window_s, schedule.duration_s)
    ramp_start, ramp_end = schedule.steady_s, schedule.steady_s + schedule.ramp_s
    exceeded_at, recovery = recovery_s(windows, TTFT_SLO_S, ramp_start)
    over = [w for w in windows if w.ttft_p95_s is not None and w.ttft_p95_s > TTFT_SLO_S]
    before = [r.ttft_s for r in requests if r.send_s < ramp_start and r.ttft_s is not None]
    during = [
        w.ttft_p95_s
        for w in windows
        if ramp_start <= w.start_s < ramp_end and w.ttft_p95_s is not None
    ]
    after = [w.ttft_p95_s for w in windows if w.start_s >= ramp_end and w.ttft_p95_s is not None]
    failed = [r for r in requests if r.error is not None]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "setup": {
            "speedup": s,
            "model": args.model,
            "concurrency": [schedule.base, 2 * schedule.base],
            "schedule_s": [schedule.steady_s, schedule.ramp_s, schedule.hold_s],
            "max_running_requests": args.max_running,
            "max_tokens": args.max_tokens,
            "max_replicas": args.max_replicas,
            "initial_replicas": args.initial_replicas,
            "cold_start_s": COLD_START_S,
            "ttft_slo_s": TTFT_SLO_S,
            "window_s": args.window_s,
        },
        "capacity": {
            "seed_decode_streams_per_replica": seed_capacity,
            "final_decode_streams_per_replica": capacity,
            "oracle_uses": "final",
        },
        "gpus_per_replica": gpus,
        "gpu_seconds": round(run_gpu_s, 1),
        "oracle_gpu_seconds": round(oracle_gpu_s, 1),
        "gpu_seconds_ratio": round(run_gpu_s / oracle_gpu_s, 3) if oracle_gpu_s else None,
        "target_ratio": 1.3,
        "measured_cold_start_s": round(cold_start_wall_s * s, 1) if cold_start_wall_s else None,
        "requests": len(requests),
        "failed": len(failed),
        "failures": sorted({r.error or "" for r in failed})[:5],
        "ttft_p95_before_ramp_s": _r(percentile([x for x in before if x is not None], 95.0)),
        "ttft_p95_worst_window_during_ramp_s": _r(max(during) if during else None),
        "ttft_p95_worst_window_after_ramp_s": _r(max(after) if after else None),
        "first_window_over_slo_s": exceeded_at,
        "recovery_s": recovery,
        "windows_over_slo": len(over),
        "windows_over_slo_before_ramp": sum(1 for w in over if w.start_s < ramp_start),
        "window_count": len(windows),
        "last_window_over_slo_s": over[-1].start_s if over else None,
        "peak_replicas": max((x.held for x in samples), default=0),
        "peak_oracle_replicas": max(oracle, default=0),
        "ttft_windows": [asdict(w) for w in windows],
        "samples": [{**asdict(x), "oracle": o} for x, o in zip(samples, oracle, strict=True)],
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def plot(summary: dict[str, Any], path: Path) -> None:
    """Replicas (held, ready, oracle) and concurrency over time; p95 TTFT per window below."""
    samples = summary["samples"]
    t = [x["t_s"] for x in samples]
    fig = Figure(figsize=(10, 7))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    top.step(t, [x["ready"] + x["warm"] + x["starting"] + x["draining"] + x["ejected"]
                 for x in samples], where="post", label="replicas holding GPUs")  # fmt: skip
    top.step(t, [x["ready"] for x in samples], where="post", label="ready replicas")
    top.step(t, [x["oracle"] for x in samples], where="post", ls="--", label="oracle replicas")
    top.set_ylabel("replicas")
    twin = top.twinx()
    twin.plot(t, [x["concurrency"] for x in samples], color="grey", alpha=0.6, label="concurrency")
    twin.set_ylabel("concurrent streams")
    lines = top.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    top.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    ratio = summary["gpu_seconds_ratio"]
    top.set_title(
        f"traffic doubles in five minutes: GPU-seconds {ratio}x the oracle's, "
        f"p95 TTFT recovery {summary['recovery_s']} s"
    )
    windows = summary["ttft_windows"]
    wt = [w["start_s"] for w in windows if w["ttft_p95_s"] is not None]
    wv = [w["ttft_p95_s"] * 1000 for w in windows if w["ttft_p95_s"] is not None]
    bottom.step(wt, wv, where="post", label=f"p95 TTFT per {summary['setup']['window_s']:g} s")
    bottom.axhline(TTFT_SLO_S * 1000, color="red", ls=":", label="SLO")
    bottom.set_yscale("log")
    bottom.set_ylabel("p95 TTFT (ms, simulated)")
    bottom.set_xlabel("simulated seconds")
    bottom.legend(loc="upper left")
    for ax in (top, bottom):
        for x in summary["setup"]["schedule_s"][:1]:
            ax.axvline(x, color="black", lw=0.5)
        ax.axvline(sum(summary["setup"]["schedule_s"][:2]), color="black", lw=0.5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


#: The largest --speedup: the scaler's tick divided by it must stay within scaler.tick_s's
#: floor of 0.1 s.
MAX_SPEEDUP = 50.0


def build_parser() -> argparse.ArgumentParser:
    """The options of `python -m homing.bench.autoscale`."""
    p = argparse.ArgumentParser(
        prog="python -m homing.bench.autoscale", description=__doc__.splitlines()[0]
    )
    p.add_argument("--speedup", type=float, default=10.0, help="simulated time / wall time")
    p.add_argument("--concurrency", type=int, default=10, help="streams before the ramp (C)")
    p.add_argument("--model", default="llama-3.1-70b", help="simulated model preset")
    p.add_argument(
        "--max-running", type=int, default=6, help="streams one replica runs (its capacity)"
    )
    p.add_argument("--max-tokens", type=int, default=512, help="tokens per completion")
    p.add_argument("--stream-interval", type=int, default=16, help="tokens per SSE chunk")
    p.add_argument("--max-replicas", type=int, default=8, help="the scaler's maximum")
    p.add_argument(
        "--initial-replicas",
        type=int,
        default=2,
        help="replicas at the start (the scaler's minimum)",
    )
    p.add_argument("--window-s", type=float, default=10.0, help="simulated s per TTFT window")
    p.add_argument("--json", default="bench-out/autoscale.json", help="summary path")
    p.add_argument("--plot", default="bench-out/autoscale.png", help="PNG path")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0; 1 when a request failed)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 < args.speedup <= MAX_SPEEDUP:
        parser.error(
            f"--speedup must be in (0, {MAX_SPEEDUP:g}]: the scaler's {TICK_S:g} s tick / speedup "
            f"must stay >= 0.1 s, got {args.speedup:g}"
        )
    configure_logging("warning")
    summary = uvloop.run(run_bench(args))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    plot(summary, Path(args.plot))
    brief = {k: v for k, v in summary.items() if k not in ("ttft_windows", "samples")}
    print(json.dumps(brief, indent=2))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
