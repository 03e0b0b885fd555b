"""What auth + quotas and the per-request metrics add to a request: the same requests
through a gateway without tenants, through one with a tenant whose three quotas live in
Redis, and through one without tenants and without request metrics, over the same worker.

Rule of this file: a measurement, not a test, and a client of the gateway: it reaches the
gateway only through `homing.app.App` and `homing.config` (never `homing.gateway`). Four
gateways (`App`s) run in this process over one simulated worker (default timing,
llama-3.1-8b on H100) and one local `redis-server` (started here on a free loopback port
unless `--redis-url` is given): "off", without tenants; "on", with one tenant whose three
quotas live in Redis; "memory", the same tenant and quotas kept in-process (`backend =
"memory"`), so that Redis's share of the difference shows; "no_metrics", "off" with `[obs]
request_metrics = false` (no per-request Prometheus series; the log line, SLO bookkeeping
and worker snapshots stay). Requests are sent one at a time on a keep-alive connection,
rotating between the gateways in rounds so that drift (CPU frequency, caches) hits them
alike. Each request is a non-streamed completion of a 16-token prompt with `max_tokens=1`,
so the engine's share is small and the gateway's is visible. Also timed alone: the key
check's work (SHA-256 of the presented key and a constant-time compare with the configured
digest, as the gateway's auth rule states it) and two `EVALSHA` round trips to the same
Redis (the floor under the gateway's two quota scripts, admission and settle).

CPU per request: this process's CPU time (`time.process_time()`, user + system, all
threads) summed over a mode's timed batches, divided by its requests (µs). The worker and
redis-server are child processes and not counted; the aiohttp client runs in this process
and is counted, the same work in every mode, as are the four gateways' background tasks
(health checks, samplers) that run during any batch. So the difference between modes is
the gateway's, and a ratio is nearer 1 than the gateway's own: `metrics_cpu_ratio` = CPU
per request of "off" (metrics on) / "no_metrics". After the warm-up, "off"'s `/metrics` must
show the request series and "no_metrics"'s must not (RuntimeError otherwise).

    python -m homing.bench.gateway_overhead --requests 2000 --json bench-out/gateway.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import uvloop

from homing.app import App
from homing.bench.report import percentile
from homing.config import (
    AdminSettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    ObsSettings,
    QuotaSettings,
    SimSettings,
    TenantSettings,
)
from homing.embedded import SimLauncher

KEY = "sk-bench"
KEY_SHA256 = hashlib.sha256(KEY.encode("utf-8")).hexdigest()
"""The key's digest as the config stores it (`printf %s "$KEY" | sha256sum`)."""
PROMPT = list(range(1000, 1016))
MODES = ("off", "memory", "on", "no_metrics")
"""Gateways: without tenants, tenant + in-process quotas, tenant + Redis quotas, without
tenants and without request metrics."""
TENANT_MODES = frozenset({"memory", "on"})
"""The modes whose requests carry the bench key."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _summary(values_ms: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50) or 0.0, 3),
        "p99_ms": round(percentile(values_ms, 99) or 0.0, 3),
        "mean_ms": round(statistics.fmean(values_ms), 3),
    }


def _tenant() -> TenantSettings:
    return TenantSettings.model_validate(
        {
            "name": "bench",
            "keys": [{"id": "bench", "sha256": KEY_SHA256}],
            "quota": {
                "requests_per_minute": 10**9,
                "tokens_per_minute": 10**12,
                "concurrent_streams": 10**6,
            },
        }
    )


async def _time_requests(
    session: aiohttp.ClientSession, url: str, model: str, count: int, auth: bool
) -> list[float]:
    headers = {"Authorization": f"Bearer {KEY}"} if auth else {}
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1}
    out: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        async with session.post(url, json=body, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"request failed with {resp.status}")
        out.append((time.perf_counter() - started) * 1000)
    return out


def metrics_cost(
    cpu_s: dict[str, float], requests: dict[str, int], on: dict[str, float], off: dict[str, float]
) -> dict[str, float]:
    """What the request metrics cost, from `cpu_s` (CPU seconds summed over each mode's
    batches), `requests` (each mode's count) and the latency summaries with metrics `on`
    ("off") and `off` ("no_metrics"): CPU µs per request of both, their ratio on/off
    (`metrics_cpu_ratio`), the added µs, and the p50/p99 latency ratios on/off."""
    on_us = cpu_s["off"] * 1e6 / requests["off"]
    off_us = cpu_s["no_metrics"] * 1e6 / requests["no_metrics"]
    return {
        "cpu_us_per_request_metrics_on": round(on_us, 1),
        "cpu_us_per_request_metrics_off": round(off_us, 1),
        "metrics_cpu_ratio": round(on_us / off_us, 4),
        "metrics_added_cpu_us": round(on_us - off_us, 1),
        "metrics_ratio_p50": round(on["p50_ms"] / off["p50_ms"], 3),
        "metrics_ratio_p99": round(on["p99_ms"] / off["p99_ms"], 3),
    }


async def _check_metrics(session: aiohttp.ClientSession, base: str, expected: bool) -> None:
    """Raise RuntimeError unless `base`'s `/metrics` has the request series (after the
    warm-up: `homing_request_e2e_seconds_count`) exactly when `expected`."""
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    if ("homing_request_e2e_seconds_count" in text) != expected:
        raise RuntimeError(f"{base}/metrics: request series {'missing' if expected else 'there'}")


async def _time_components(redis_url: str, count: int) -> dict[str, Any]:
    """`count` timings (ms) of the key check's work and of two Redis script round trips."""
    configured = bytes.fromhex(KEY_SHA256)
    client = aioredis.Redis.from_url(redis_url)
    script = client.register_script("return 1")
    key_ms: list[float] = []
    redis_ms: list[float] = []
    try:
        await script()  # loads the script, so every timed call is one EVALSHA
        for _ in range(count):
            started = time.perf_counter()
            digest = hashlib.sha256(KEY.encode("utf-8")).digest()
            if not hmac.compare_digest(digest, configured):
                raise RuntimeError("the bench key does not match its digest")
            key_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await script()
            await script()
            redis_ms.append((time.perf_counter() - started) * 1000)
    finally:
        await client.aclose()
    return {"key_check": _summary(key_ms), "redis_round_trips": _summary(redis_ms)}


def _start_redis() -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found (make test installs it)")
    port = _free_port()
    redis = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.02)
    return redis, f"redis://127.0.0.1:{port}/0"


async def run(requests: int, rounds: int, redis_url: str) -> dict[str, Any]:
    """Run the comparison against Redis at `redis_url`; the result as a JSON-able dict."""
    sims = SimLauncher(SimSettings(workers=1))
    try:
        urls = await sims.start(timeout_s=60)
        base = HomingConfig(  # no admin API: three gateways in one process would share its socket
            gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
            engines=EngineSettings(workers=urls),
            admin=AdminSettings(enabled=False),
        )
        redis_quotas = QuotaSettings(backend="redis", redis_url=redis_url, key_prefix="bench")
        configs = {
            "off": base,
            "memory": base.model_copy(
                update={"tenants": [_tenant()], "quotas": QuotaSettings(backend="memory")}
            ),
            "on": base.model_copy(update={"tenants": [_tenant()], "quotas": redis_quotas}),
            "no_metrics": base.model_copy(update={"obs": ObsSettings(request_metrics=False)}),
        }
        samples: dict[str, list[float]] = {mode: [] for mode in MODES}
        cpu_s = dict.fromkeys(MODES, 0.0)
        cpu_rounds: dict[str, list[float]] = {mode: [] for mode in MODES}  # us per request
        async with contextlib.AsyncExitStack() as stack:
            apps = {
                mode: await stack.enter_async_context(App(config))
                for mode, config in configs.items()
            }
            session = await stack.enter_async_context(aiohttp.ClientSession())
            model = apps["off"].model.model_id  # type: ignore[union-attr]
            targets = {
                mode: f"http://127.0.0.1:{app.http_port}/v1/completions"
                for mode, app in apps.items()
            }
            for mode, url in targets.items():  # warm-up: connections, caches, scripts
                await _time_requests(session, url, model, 50, auth=mode in TENANT_MODES)
            for mode in ("off", "no_metrics"):  # the switch does what the comparison assumes
                base_url = targets[mode].removesuffix("/v1/completions")
                await _check_metrics(session, base_url, expected=mode == "off")
            per_round = max(1, requests // rounds)
            for r in range(rounds):
                order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
                for mode in order:
                    cpu0 = time.process_time()
                    samples[mode] += await _time_requests(
                        session, targets[mode], model, per_round, auth=mode in TENANT_MODES
                    )
                    cpu = time.process_time() - cpu0
                    cpu_s[mode] += cpu
                    cpu_rounds[mode].append(round(cpu * 1e6 / per_round, 1))
        components = await _time_components(redis_url, requests)
        components["recorder_done_us"] = _time_recorder(max(requests, 20000))
    finally:
        await sims.stop()
    off_s, mem_s, on_s, nometrics_s = (_summary(samples[mode]) for mode in MODES)
    counts = {mode: len(samples[mode]) for mode in MODES}
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": _machine(),
        "python": platform.python_version(),
        "requests_per_mode": len(samples["off"]),
        "without_tenants": off_s,
        "with_tenants_redis": on_s,
        "added_p50_ms": round(on_s["p50_ms"] - off_s["p50_ms"], 3),
        "added_p99_ms": round(on_s["p99_ms"] - off_s["p99_ms"], 3),
        "ratio_p50": round(on_s["p50_ms"] / off_s["p50_ms"], 3),
        "ratio_p99": round(on_s["p99_ms"] / off_s["p99_ms"], 3),
        "with_tenants_memory": mem_s,
        "redis_share_p50_ms": round(on_s["p50_ms"] - mem_s["p50_ms"], 3),
        "redis_share_p99_ms": round(on_s["p99_ms"] - mem_s["p99_ms"], 3),
        "components": components,
        "without_metrics": nometrics_s,
        "cpu_us_per_request": {mode: round(cpu_s[mode] * 1e6 / counts[mode], 1) for mode in MODES},
        "cpu_us_per_request_by_round": cpu_rounds,
        "cpu_counts": "this process (time.process_time): gateways, their background tasks "
        "and the aiohttp client alike in every mode; not the worker or redis-server",
        **metrics_cost(cpu_s, counts, off_s, nometrics_s),
    }


def _machine() -> str:
    """CPU model, cores and memory, e.g. "AMD EPYC, 2 cores, 24 GiB" (Linux)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB"


def _time_recorder(count: int, rounds: int = 5) -> dict[str, float]:
    """CPU us of one `RequestRecorder.done` (log line filtered out) with the request metrics
    on and off: the median of `rounds` runs of `count` reports each, interleaved."""
    import logging

    import structlog
    from prometheus_client import CollectorRegistry

    from homing.obs.requests import RequestDone, RequestMetrics, RequestRecorder

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    runs: dict[str, list[float]] = {"metrics_on": [], "metrics_off": []}
    for _ in range(rounds):
        for mode in runs:
            registry = CollectorRegistry()
            metrics = RequestMetrics(registry) if mode == "metrics_on" else None
            recorder = RequestRecorder(now=time.monotonic, metrics=metrics, registry=registry)
            reports = [
                RequestDone(request_id="r", outcome="ok", model="m", worker="w0", ttft_s=0.1,
                            tpot_s=0.01, e2e_s=1.0, queue_s=0.001, prompt_tokens=1000,
                            cached_tokens=500, completion_tokens=100, finish_reason="stop")
                for _ in range(count)
            ]  # fmt: skip
            started = time.process_time()
            for report in reports:
                recorder.done(report)
            runs[mode].append((time.process_time() - started) / count * 1e6)
    out = {mode: round(statistics.median(v), 2) for mode, v in runs.items()}
    out["added"] = round(out["metrics_on"] - out["metrics_off"], 2)
    return out


def _table(result: dict[str, Any]) -> str:
    off, on = result["without_tenants"], result["with_tenants_redis"]
    mem, comp = result["with_tenants_memory"], result["components"]
    rows = [
        "| run | p50 ms | p99 ms | mean ms |",
        "|---|---:|---:|---:|",
        f"| without tenants | {off['p50_ms']} | {off['p99_ms']} | {off['mean_ms']} |",
        f"| tenant + Redis quotas | {on['p50_ms']} | {on['p99_ms']} | {on['mean_ms']} |",
        f"| added | {result['added_p50_ms']} | {result['added_p99_ms']} | |",
        f"| ratio | {result['ratio_p50']} | {result['ratio_p99']} | |",
        f"| tenant + in-process quotas | {mem['p50_ms']} | {mem['p99_ms']} | {mem['mean_ms']} |",
        f"| Redis's share (Redis - in-process) | {result['redis_share_p50_ms']} | "
        f"{result['redis_share_p99_ms']} | |",
        f"| key check alone (SHA-256 + compare) | {comp['key_check']['p50_ms']} | "
        f"{comp['key_check']['p99_ms']} | {comp['key_check']['mean_ms']} |",
        f"| 2 Redis EVALSHA round trips alone | {comp['redis_round_trips']['p50_ms']} | "
        f"{comp['redis_round_trips']['p99_ms']} | {comp['redis_round_trips']['mean_ms']} |",
    ]
    cpu = result["cpu_us_per_request"]
    nom = result["without_metrics"]
    rows += [
        "",
        "| metrics on the request path | p50 ms | p99 ms | mean ms | CPU us/request |",
        "|---|---:|---:|---:|---:|",
        f"| metrics on (without tenants) | {off['p50_ms']} | {off['p99_ms']} | "
        f"{off['mean_ms']} | {cpu['off']} |",
        f"| metrics off (request_metrics = false) | {nom['p50_ms']} | {nom['p99_ms']} | "
        f"{nom['mean_ms']} | {cpu['no_metrics']} |",
        f"| added | | | | {result['metrics_added_cpu_us']} |",
        f"| ratio on/off | {result['metrics_ratio_p50']} | {result['metrics_ratio_p99']} | | "
        f"{result['metrics_cpu_ratio']} |",
        "",
        "CPU us/request: this process (client + gateways), not the worker; per mode: "
        + ", ".join(f"{mode} {value}" for mode, value in cpu.items()),
        "RequestRecorder.done alone (CPU us, log line filtered out): "
        + ", ".join(f"{k} {v}" for k, v in comp["recorder_done_us"].items()),
    ]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: print the table, write `--json`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="requests per gateway")
    parser.add_argument("--rounds", type=int, default=10, help="alternations between the gateways")
    parser.add_argument("--redis-url", help="use this Redis instead of starting one")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    redis: subprocess.Popen[bytes] | None = None
    redis_url = args.redis_url
    if redis_url is None:
        redis, redis_url = _start_redis()
    try:
        result = uvloop.run(run(args.requests, args.rounds, redis_url))
    finally:
        if redis is not None:
            redis.terminate()
            redis.wait()
    print(f"{result['date']}, {result['machine']}, Python {result['python']}")
    print(_table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
