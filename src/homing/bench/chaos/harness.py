"""`python -m homing.bench.chaos` (`make chaos`): kill, stall, slow down, restart, flap and
reject simulated workers under streaming load through a real gateway, and check that no
request hangs and none fails before its first byte while another healthy worker exists.

Rule of this file: the I/O shell; what a request's bytes mean is `outcome`, what a
scenario's records mean is `analysis`, what a scenario does is `scenarios`.

Processes (each its own, so a SIGKILL of a worker cannot take the harness down): `--workers`
simulated workers, each a `homing sim --workers 1` child (gRPC on port P, its fault sidecar
on P + 1, `--parent-pid` this process), and one `homing serve --worker grpc://... --config
TOML --log-level info` child with a state directory of its own (its admin socket), logging
to `--log-dir`, that Linux stops when this process dies (EXIT_WITH_PARENT). TOML is
`--gateway-config` copied (empty without it: the gateway's defaults). The gateway's worker
ids (`x-homing-worker`) are mapped to the workers by its admin API (`homing workers ls
--output json`).

Load: `--concurrency` clients, each looping until the scenario ends: one streamed chat
completion (`temperature` 0, `ignore_eos`, `max_tokens` `--max-tokens`, a prompt of its own
so no prefix is shared), read to its end under a per-request deadline of `--deadline-s` (a
request past it is HUNG, never awaited longer); after a failed request a client pauses
FAILURE_PAUSE_S so an instant refusal cannot spin it. Requests are counted in the scenario
they started in; a scenario's last requests finish before the next one begins. The load
runs for the scenario's phases (`scenarios.phases`), at least the post-fault phase after the
last fault actually ended (a killed worker's restart takes its own time), and on while a
faulty worker has not served again, RECOVERY_WAIT_S after its fault's end at most.

Scenarios (`homing.bench.chaos.scenarios`) run one at a time, each after a settle step
(every fault cleared, a dead worker started again, every worker healthy in the gateway's
`/ready`, SETTLE_TIMEOUT_S at most). `/metrics` is read every SAMPLE_INTERVAL_S for the
gateway's view of worker health and its retry counter; without such a counter, retries are
the gateway log's `request_retried` lines.

Output: a table on stdout, `--json OUT` (settings, workers, one object per scenario as
`analysis.summarize` makes it). Exit status: 0 when every check of every scenario holds, 1
when one does not (a hung request included) or the stack cannot start, 2 for bad
arguments, 130 when interrupted (the partial result is still printed and written).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from homing.bench.chaos.analysis import (
    CHECKS,
    CounterReading,
    FaultWindow,
    RequestRecord,
    count_retried_log_lines,
    counter_delta,
    migration_counter,
    retry_counter,
    stop_and_back,
    summarize,
)
from homing.bench.chaos.outcome import ChatStream, End, Outcome, classify
from homing.bench.chaos.scenarios import (
    DEFAULT_FLAP_PERIOD_S,
    RECOVERY_WAIT_S,
    SCENARIOS,
    SLOWDOWN_FACTOR,
    FaultPlan,
    Phases,
    flap_schedule,
    phases,
    plan,
)
from homing.sim.process import spawn_sim, terminate

SIM_MODEL = "llama-3.1-8b"
DEFAULT_WORKERS = 3
DEFAULT_DURATION_S = 30.0
DEFAULT_CONCURRENCY = 8
DEFAULT_MAX_TOKENS = 32
DEFAULT_DEADLINE_S = 30.0
DEFAULT_SPEEDUP = 1.0
READY_TIMEOUT_S = 120.0
"""Seconds a started process (worker or gateway) has to serve."""
RESTART_TIMEOUT_S = 60.0
"""Seconds a killed worker has to serve again on its port (the port may linger a moment)."""
SETTLE_TIMEOUT_S = 60.0
SAMPLE_INTERVAL_S = 0.5
"""Between two reads of the gateway's `/metrics` (it builds at most 4 a second)."""
FAILURE_PAUSE_S = 0.1
CONTROL_TIMEOUT_S = 30.0
"""Per call to a sidecar, `/ready`, `/metrics` or the admin CLI (a restart answers when the
worker serves again)."""
STOP_GRACE_S = 15.0
ERROR_BODY_BYTES = 4096

EXIT_WITH_PARENT = (
    "import os, sys\n"
    "from homing.lifeline import exit_with_parent\n"
    "if not exit_with_parent(int(sys.argv[1])):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
"""`python -c` program that asks Linux to SIGTERM it when this process dies (kept across
exec) and then becomes the command after the parent's pid: the gateway, which has no
`--parent-pid` of its own, so a harness killed with SIGKILL leaves no gateway behind."""

WORDS = (
    "river", "lantern", "orchard", "glacier", "compass", "meadow", "harbor", "violin",
    "canyon", "ember", "falcon", "quarry", "thistle", "beacon", "marble", "tundra",
)  # fmt: skip


# ============================================================================ processes


@dataclass
class SimProc:
    """One simulated worker process: gRPC on `port`, its fault sidecar on `port` + 1."""

    index: int
    port: int = 0
    proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    @property
    def sidecar(self) -> str:
        return f"http://127.0.0.1:{self.port + 1}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


@dataclass(frozen=True)
class Scrape:
    """One read of the gateway's `/metrics`: worker id -> healthy, and its counters of
    retries and stream migrations (None: it has no such counter)."""

    healthy: dict[str, bool]
    retries: CounterReading | None
    migrations: CounterReading | None


@dataclass
class Stack:
    """The workers and the gateway over them, and this process's control session."""

    workers: int
    speedup: float
    log_dir: Path
    gateway_config: Path | None = None
    policy: str | None = None
    sims: list[SimProc] = field(default_factory=list)
    gateway: asyncio.subprocess.Process | None = None
    base_url: str = ""
    model: str = ""
    worker_ids: list[str] = field(default_factory=list)
    health_samples: list[tuple[float, dict[str, bool]]] = field(default_factory=list)
    control: aiohttp.ClientSession | None = None
    _scratch: tempfile.TemporaryDirectory[str] | None = None
    _sampler: asyncio.Task[None] | None = None

    @property
    def gateway_log(self) -> Path:
        return self.log_dir / "gateway.log"

    async def start(self) -> None:
        """Start the workers, then the gateway; wait until it serves every worker healthy.
        Raises RuntimeError (naming the log to read) when a process does not come up."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._scratch = tempfile.TemporaryDirectory(prefix="homing-chaos-")
        scratch = Path(self._scratch.name)
        self.control = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S))
        self.sims = [SimProc(i) for i in range(self.workers)]
        await asyncio.gather(*(self.start_worker(s) for s in self.sims))
        config = scratch / "gateway.toml"
        text = "# homing.bench.chaos: the gateway's defaults\n"
        if self.gateway_config is not None:
            text = self.gateway_config.read_text(encoding="utf-8")
        config.write_text(text, encoding="utf-8")
        state = scratch / "state"  # its own admin socket, whatever else runs here
        state.mkdir()
        self._env = {**os.environ, "HOMING_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1"}
        port, grpc_port = _free_port(), _free_port()
        argv = [
            sys.executable, "-m", "homing", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", str(grpc_port), "--config", str(config), "--log-level", "info",
        ]  # fmt: skip
        if self.policy is not None:
            argv += ["--policy", self.policy]
        for sim in self.sims:
            argv += ["--worker", sim.url]
        with self.gateway_log.open("ab") as log:
            self.gateway = await asyncio.create_subprocess_exec(
                sys.executable, "-c", EXIT_WITH_PARENT, str(os.getpid()), *argv,
                stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
                env=self._env, start_new_session=True,
            )  # fmt: skip
        self.base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while await self.ready_workers() != self.workers:
            if self.gateway.returncode is not None:
                raise RuntimeError(
                    f"the gateway exited with {self.gateway.returncode}; see {self.gateway_log}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway is not ready; see {self.gateway_log}")
            await asyncio.sleep(0.2)
        self.model = await self._model()
        self.worker_ids = await self._worker_ids()
        self._sampler = asyncio.create_task(self._sample())

    async def start_worker(self, sim: SimProc) -> None:
        """Start `sim` (on its port when it has one, retried while the port lingers)."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:
            args = ["--workers", "1", "--port", str(sim.port), "--model", SIM_MODEL]
            args += ["--speedup", f"{self.speedup:g}", "--parent-pid", str(os.getpid())]
            with (self.log_dir / f"sim-{sim.index}.log").open("ab") as log:
                try:
                    proc, ready = await spawn_sim(args, stderr=log.fileno(), timeout_s=60.0)
                except RuntimeError:
                    if sim.port == 0 or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"worker {sim.index} did not start; see {log.name}"
                        ) from None
                    await asyncio.sleep(0.3)
                    continue
            sim.proc = proc
            sim.port = int(ready["workers"][0]["port"])
            return

    async def kill(self, sim: SimProc) -> None:
        """SIGKILL the worker's process (its own session, so its whole group) and reap it."""
        if sim.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sim.proc.pid, signal.SIGKILL)
        await sim.proc.wait()

    async def post_fault(self, sim: SimProc, body: Mapping[str, object]) -> None:
        """POST `body` to the worker's sidecar; RuntimeError unless it answers 200/202."""
        assert self.control is not None
        async with self.control.post(f"{sim.sidecar}/fault", json=dict(body)) as resp:
            if resp.status not in (200, 202):
                raise RuntimeError(f"fault {body} on worker {sim.index}: {await resp.text()}")

    async def ready_workers(self) -> int | None:
        """`healthy_workers` of the gateway's `/ready` (None when it does not answer)."""
        assert self.control is not None
        try:
            async with self.control.get(f"{self.base_url}/ready") as resp:
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        count = body.get("healthy_workers") if isinstance(body, dict) else None
        return count if isinstance(count, int) else None

    async def settle(self, timeout_s: float) -> bool:
        """Clear every fault, start any dead worker again, and wait until the gateway counts
        every worker healthy; False when that did not happen within `timeout_s`."""
        for sim in self.sims:
            if not sim.alive:
                await self.start_worker(sim)
        for sim in self.sims:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError):
                await self.post_fault(sim, {})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self.ready_workers() == self.workers:
                return True
            await asyncio.sleep(0.2)
        return False

    async def scrape(self) -> Scrape | None:
        """What the gateway's `/metrics` says now, or None when it does not answer."""
        assert self.control is not None
        try:
            async with self.control.get(f"{self.base_url}/metrics") as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        healthy: dict[str, bool] = {}
        counters: list[tuple[str, dict[str, str], float]] = []
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.name == "homing_worker_healthy" and "worker" in sample.labels:
                    healthy[sample.labels["worker"]] = sample.value >= 1
                elif family.type == "counter":
                    counters.append((sample.name, sample.labels, sample.value))
        return Scrape(healthy, retry_counter(counters), migration_counter(counters))

    async def _sample(self) -> None:
        while True:
            scraped = await self.scrape()
            if scraped is not None:
                self.health_samples.append((time.monotonic(), scraped.healthy))
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def _model(self) -> str:
        assert self.control is not None
        async with self.control.get(f"{self.base_url}/v1/models") as resp:
            return str((await resp.json())["data"][0]["id"])

    async def _worker_ids(self) -> list[str]:
        """The gateway's id of each worker, in `sims` order (`homing workers ls`)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "homing", "workers", "ls", "--output", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL, env=self._env,
        )  # fmt: skip
        try:
            async with asyncio.timeout(CONTROL_TIMEOUT_S):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError("`homing workers ls` did not answer") from None
        if proc.returncode != 0:
            raise RuntimeError(f"`homing workers ls` failed: {err.decode(errors='replace')}")
        by_url = {w["url"]: w["id"] for w in json.loads(out)["workers"]}
        missing = [s.url for s in self.sims if s.url not in by_url]
        if missing:
            raise RuntimeError(f"the gateway does not list {missing}: {by_url}")
        return [by_url[s.url] for s in self.sims]

    def log_size(self) -> int:
        """Bytes in the gateway's log now."""
        try:
            return self.gateway_log.stat().st_size
        except OSError:
            return 0

    def log_lines(self, start: int, end: int) -> list[str]:
        """The gateway's log lines between byte offsets `start` and `end`."""
        with self.gateway_log.open("rb") as f:
            f.seek(start)
            return f.read(max(end - start, 0)).decode("utf-8", errors="replace").splitlines()

    async def stop(self) -> None:
        """Stop the sampler, the gateway and every worker (SIGTERM, SIGKILL after a grace)."""
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        procs = [s.proc for s in self.sims if s.proc is not None]
        if self.gateway is not None:
            procs.append(self.gateway)
        await terminate(procs, grace_s=STOP_GRACE_S)  # no load is left: all at once
        if self.control is not None:
            await self.control.close()
        if self._scratch is not None:
            self._scratch.cleanup()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ============================================================================ load


@dataclass(frozen=True)
class LoadSettings:
    """What every client request asks for and how long it may take."""

    url: str
    model: str
    max_tokens: int
    deadline_s: float


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The streamed, greedy chat completion every client request sends."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def one_request(
    session: aiohttp.ClientSession, load: LoadSettings, prompt: str, client: int, t0: float
) -> RequestRecord:
    """Send one request and read it to its end or its deadline (times relative to `t0`)."""
    start = time.monotonic()
    status: int | None = None
    worker: str | None = None
    stream = ChatStream()
    error_body = b""
    transport_error = ""
    end = End.EOF
    body = chat_body(load.model, prompt, load.max_tokens)
    try:
        async with asyncio.timeout(load.deadline_s) as deadline:
            async with session.post(f"{load.url}/v1/chat/completions", json=body) as resp:
                status = resp.status
                worker = resp.headers.get("x-homing-worker") or None
                if status != 200:
                    error_body = await resp.content.read(ERROR_BODY_BYTES)
                else:
                    async for data in resp.content.iter_any():
                        stream.feed(data, time.monotonic() - t0)
    except TimeoutError as err:
        if deadline.expired():
            end = End.DEADLINE
        else:
            end, transport_error = End.TRANSPORT, repr(err)
    except (aiohttp.ClientError, OSError) as err:
        end, transport_error = End.TRANSPORT, f"{type(err).__name__}: {err}"[:300]
    verdict = classify(status, stream, end, error_body=error_body, transport_error=transport_error)
    return RequestRecord(
        client=client,
        start_s=start - t0,
        end_s=time.monotonic() - t0,
        status=status,
        worker=worker,
        first_content_s=stream.first_content_s,
        outcome=verdict.outcome,
        reason=verdict.reason,
    )


async def client_loop(
    session: aiohttp.ClientSession,
    load: LoadSettings,
    client: int,
    scenario: str,
    stop: asyncio.Event,
    records: list[RequestRecord],
    recorded: asyncio.Event,
    t0: float,
) -> None:
    """Requests one after another until `stop` is set (the last one is read to its end);
    each ended one is appended to `records` and sets `recorded`."""
    rng = random.Random(f"{scenario}-{client}")
    k = 0
    while not stop.is_set():
        words = " ".join(rng.choice(WORDS) for _ in range(4))
        prompt = f"Chaos {scenario} client {client} request {k}: a short note on {words}."
        record = await one_request(session, load, prompt, client, t0)
        records.append(record)
        recorded.set()
        k += 1
        if record.outcome is not Outcome.COMPLETED:
            await asyncio.sleep(FAILURE_PAUSE_S)


# ============================================================================ faults


async def _sleep_until(at: float) -> None:
    await asyncio.sleep(max(at - time.monotonic(), 0.0))


async def run_fault(
    stack: Stack, fault: FaultPlan, ph: Phases, flap_period_s: float, t0: float
) -> FaultWindow:
    """Inject `fault` now and end it after `ph.fault_s` (a restart ends when it is done);
    the window in seconds from `t0`. A fault that could not be ended has `end_s` None."""
    sim = stack.sims[fault.worker]
    wid = stack.worker_ids[fault.worker]
    start = time.monotonic()
    until = start + ph.fault_s
    end: float | None = None
    kind = fault.kind
    try:
        if kind == "kill":
            await stack.kill(sim)
            await _sleep_until(until)
            await stack.start_worker(sim)
        elif kind == "stall":
            await stack.post_fault(sim, {"stall_s": ph.fault_s})
            await _sleep_until(until)
        elif kind == "slowdown":
            await stack.post_fault(sim, {"slowdown": SLOWDOWN_FACTOR})
            await _sleep_until(until)
            await stack.post_fault(sim, {"slowdown": 1})
        elif kind == "restart":
            await stack.post_fault(sim, {"restart": True})
        elif kind == "flap":
            for offset, healthy in flap_schedule(ph.fault_s, flap_period_s):
                await _sleep_until(start + offset)
                await stack.post_fault(sim, {"health": healthy})
        elif kind == "reject":
            await stack.post_fault(sim, {"reject": "UNAVAILABLE"})
            await _sleep_until(until)
            await stack.post_fault(sim, {"reject": None})
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        end = time.monotonic()
    except (aiohttp.ClientError, TimeoutError, RuntimeError) as err:
        print(f"chaos: fault {kind} on {wid} failed: {err}", file=sys.stderr, flush=True)
    return FaultWindow(kind, wid, start - t0, None if end is None else end - t0)


# ============================================================================ scenarios


def _all_back(windows: Sequence[FaultWindow], records: Sequence[RequestRecord]) -> bool:
    """True when every ended fault's worker that served before it has served again (the
    faults that did not end cannot be waited for)."""
    for window in windows:
        if window.end_s is None:
            continue
        _, stopped, back = stop_and_back(window, records)
        if stopped is not None and back is None:
            return False
    return True


async def run_scenario(
    stack: Stack, session: aiohttp.ClientSession, name: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Settle, run the load with scenario `name`'s faults, and summarize it."""
    faults = plan(name, stack.workers)
    ph = phases(args.duration_s)
    settle_started = time.monotonic()
    settled = await stack.settle(SETTLE_TIMEOUT_S)
    settle_s = time.monotonic() - settle_started
    load = LoadSettings(stack.base_url, stack.model, args.max_tokens, args.deadline_s)
    log_start = stack.log_size()
    before = await stack.scrape()
    records: list[RequestRecord] = []
    stop, recorded = asyncio.Event(), asyncio.Event()
    t0 = time.monotonic()
    clients = [
        asyncio.create_task(client_loop(session, load, i, name, stop, records, recorded, t0))
        for i in range(args.concurrency)
    ]
    fault_tasks: list[asyncio.Task[FaultWindow]] = []
    try:
        await _sleep_until(t0 + ph.pre_s)
        fault_tasks = [
            asyncio.create_task(run_fault(stack, f, ph, args.flap_period_s, t0)) for f in faults
        ]
        windows = list(await asyncio.gather(*fault_tasks))
        ends = [w.end_s for w in windows if w.end_s is not None]
        await _sleep_until(t0 + max([ph.total_s, *(e + ph.post_s for e in ends)]))
        cap = t0 + max([0.0, *(e + max(ph.post_s, RECOVERY_WAIT_S) for e in ends)])
        while not _all_back(windows, records) and time.monotonic() < cap:
            recorded.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(cap - time.monotonic()):
                    await recorded.wait()
        load_end = time.monotonic() - t0
        stop.set()
        await asyncio.wait(clients)  # each ends by its request's deadline
    finally:
        stop.set()
        for task in (*clients, *fault_tasks):
            task.cancel()
        await asyncio.gather(*clients, *fault_tasks, return_exceptions=True)
    after = await stack.scrape()
    retries = migrations = None  # None: the gateway has no such counter (or did not answer)
    if before is not None and after is not None:
        retries = counter_delta(before.retries, after.retries)
        migrations = counter_delta(before.migrations, after.migrations)
    retry_outcomes: dict[str, int] | None = None
    if retries is not None and after is not None and after.retries is not None:  # both read
        retried: int | None = retries[0]
        retry_outcomes = retries[1]
        source: str | None = f"metric {after.retries.name}"
    else:
        try:
            lines = stack.log_lines(log_start, stack.log_size())
            retried, source = count_retried_log_lines(lines), "log request_retried"
        except OSError:
            retried, source = None, None
    samples = [(t - t0, h) for t, h in stack.health_samples if t >= t0 - 1.0]
    summary = summarize(
        name,
        records,
        windows,
        stack.worker_ids,
        health_samples=samples,
        retried=retried,
        retried_source=source,
        retry_outcomes=retry_outcomes,
        migrated=None if migrations is None else migrations[0],
        migration_outcomes=None if migrations is None else migrations[1],
        settled=settled,
        load_end_s=load_end,
    )
    summary["plan"] = [f.label(stack.worker_ids) for f in faults]
    summary["phases_s"] = {"pre": ph.pre_s, "fault": ph.fault_s, "post": ph.post_s}
    summary["settle_s"] = round(settle_s, 3)
    summary["wall_s"] = round(time.monotonic() - settle_started, 3)
    if stack.gateway is not None and stack.gateway.returncode is not None:
        raise RuntimeError(
            f"the gateway exited with {stack.gateway.returncode}; see {stack.gateway_log}"
        )
    return summary


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, run every scenario, stop everything; the result as a JSON-able dict
    (`interrupted` when SIGINT/SIGTERM ended it early)."""
    stack = Stack(
        workers=args.workers,
        speedup=args.speedup,
        log_dir=args.log_dir,
        gateway_config=args.gateway_config,
        policy=args.policy,
    )
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        if task is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, task.cancel)
                installed.append(sig)
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    interrupted = False
    error: str | None = None
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )
    try:
        await stack.start()
        for name in args.scenarios:
            results.append(await run_scenario(stack, session, name, args))
            verdict = "ok" if results[-1]["ok"] else "FAILED"
            print(f"chaos: {name} {verdict}", file=sys.stderr, flush=True)
    except asyncio.CancelledError:
        interrupted = True
        if task is not None:
            task.uncancel()  # handled here: the teardown below must not be cancelled
    except RuntimeError as err:
        error = str(err)
        print(f"chaos: error: {err}", file=sys.stderr, flush=True)
    finally:
        await session.close()
        with contextlib.suppress(asyncio.CancelledError):
            await stack.stop()
        for sig in installed:
            loop.remove_signal_handler(sig)
    return {
        "command": " ".join(["python -m homing.bench.chaos", *args.argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cores": os.cpu_count()},
        "wall_s": round(time.monotonic() - started, 1),
        "settings": {
            "scenarios": list(args.scenarios),
            "workers": args.workers,
            "model": SIM_MODEL,
            "speedup": args.speedup,
            "duration_s": args.duration_s,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "deadline_s": args.deadline_s,
            "flap_period_s": args.flap_period_s,
            "policy": args.policy,
            "gateway_config": None if args.gateway_config is None else str(args.gateway_config),
            "log_dir": str(args.log_dir),
        },
        "workers": [
            {"index": s.index, "id": wid, "url": s.url}
            for s, wid in zip(stack.sims, stack.worker_ids, strict=False)
        ],
        "checks": CHECKS,
        "scenarios": results,
        "interrupted": interrupted,
        "error": error,
        "ok": error is None and not interrupted and all(r["ok"] for r in results),
    }


# ============================================================================ output


def _seconds(value: float | None, applicable: bool = True) -> str:
    if not applicable:
        return "-"
    return "never" if value is None else f"{value:.1f}"


def _stop_cell(fault: dict[str, Any]) -> str:
    if fault["stopped"] is None:
        return "-"
    if fault["stopped"] is False:
        return "never"
    return _seconds(fault["stopped_after_s"])


def _back_cell(fault: dict[str, Any]) -> str:
    if fault["stopped"] is None:
        return "-"
    if fault["end_s"] is None:
        return "not ended"
    return _seconds(fault["back_after_s"])


def _count_cell(done: int | None, outcomes: Mapping[str, int] | None, name: str) -> str:
    """'5', '5 (+2 refused)' when the counter's other outcomes grew, or 'n/a'."""
    if done is None:
        return "n/a"
    refused = sum(v for k, v in (outcomes or {}).items() if k not in (name, ""))
    return f"{done} (+{refused} refused)" if refused else str(done)


def table_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """The table's cells, one row per scenario (see `print_table`)."""
    rows = []
    for s in result["scenarios"]:
        failed = [name for name, ok in s["checks"].items() if not ok]
        early = str(s["failed_before_first_byte"])
        if s["failed_before_first_byte"]:
            early += f" ({s['failed_before_first_byte_with_healthy_other']})"
        rows.append(
            [
                s["name"],
                ", ".join(s["plan"]),
                str(s["sent"]),
                str(s["completed"]),
                early,
                str(s["failed_mid_stream"]),
                str(s["cut"]),
                str(s["hung"]),
                _count_cell(s["retried"], s["retry_outcomes"], "retried"),
                _count_cell(s["migrated"], s["migration_outcomes"], "migrated"),
                " / ".join(_stop_cell(f) for f in s["faults"]),
                " / ".join(_back_cell(f) for f in s["faults"]),
                "ok" if not failed else "FAIL: " + ", ".join(failed),
            ]
        )
    return rows


TABLE_COLUMNS = (
    "scenario", "faults", "sent", "completed", "failed <1st byte (healthy other)",
    "mid-stream error", "cut silently", "hung", "retried", "migrated", "stopped after (s)",
    "back after (s)", "checks",
)  # fmt: skip


def print_table(result: Mapping[str, Any]) -> None:
    """The scenarios as a rich table on stdout, then the retry source and any error."""
    from rich.console import Console
    from rich.table import Table

    settings = result["settings"]
    table = Table(
        title=f"chaos: {settings['workers']} simulated workers, {settings['concurrency']} "
        f"streaming clients, {settings['duration_s']:g} s a scenario, deadline "
        f"{settings['deadline_s']:g} s",
        title_justify="left",
    )
    for name in TABLE_COLUMNS:
        left = name in ("scenario", "faults", "checks")
        table.add_column(name, justify="left" if left else "right")
    for row in table_rows(result):
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        console = Console(width=220)
    console.print(table)
    sources = sorted({s["retried_source"] or "n/a" for s in result["scenarios"]})
    console.print(f"retried from: {', '.join(sources) or 'n/a'}; wall time {result['wall_s']} s")
    if result["error"]:
        console.print(f"error: {result['error']}")
    if result["interrupted"]:
        console.print("interrupted: the table holds the scenarios that finished")


# ============================================================================ command line


def _scenarios(text: str) -> list[str]:
    if text.strip() == "all":
        return list(SCENARIOS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)} or all"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    """The command-line options (defaults: the full suite, ~4 minutes)."""
    p = argparse.ArgumentParser(
        prog="python -m homing.bench.chaos",
        description="Kill, stall, slow down, restart, flap and reject simulated workers "
        "under streaming load through a real gateway; check that no request hangs and none "
        "fails before its first byte while another healthy worker exists.",
    )
    p.add_argument(
        "--scenarios",
        type=_scenarios,
        default=list(SCENARIOS),
        help=f"comma-separated, of {', '.join(SCENARIOS)} (default all, in that order)",
    )
    p.add_argument(
        "--duration-s",
        type=float,
        default=DEFAULT_DURATION_S,
        help=f"seconds of load per scenario: 15%% before the fault, 35%% under it, the rest "
        f"after its end, longer while a faulty worker has not served again (at most "
        f"{RECOVERY_WAIT_S:g} s after it; default {DEFAULT_DURATION_S:g})",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"clients, each one request at a time (default {DEFAULT_CONCURRENCY})",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=DEFAULT_SPEEDUP,
        help=f"the simulated workers' clock speedup (default {DEFAULT_SPEEDUP:g})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help=f"simulated workers (default {DEFAULT_WORKERS})",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"tokens per answer (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        default=DEFAULT_DEADLINE_S,
        help=f"per-request client deadline; a request past it is hung "
        f"(default {DEFAULT_DEADLINE_S:g})",
    )
    p.add_argument(
        "--flap-period-s",
        type=float,
        default=DEFAULT_FLAP_PERIOD_S,
        help=f"seconds between health flips in 'flap' (default {DEFAULT_FLAP_PERIOD_S:g})",
    )
    p.add_argument(
        "--policy",
        choices=["cache_aware", "round_robin", "least_load", "consistent_hash"],
        default=None,
        help="routing policy (default: the gateway's)",
    )
    p.add_argument("--gateway-config", type=Path, default=None, help="TOML the gateway runs with")
    p.add_argument(
        "--log-dir",
        type=Path,
        default=Path("bench-out/chaos-logs"),
        help="the processes' logs (appended; default bench-out/chaos-logs)",
    )
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the result")
    return p


def _problems(args: argparse.Namespace) -> list[str]:
    problems = []
    for name in ("duration_s", "speedup", "deadline_s", "flap_period_s"):
        value = getattr(args, name)
        if not (value > 0 and value < float("inf")):
            problems.append(f"--{name.replace('_', '-')} must be a finite number > 0")
    if args.concurrency < 1:
        problems.append("--concurrency must be >= 1")
    if not 1 <= args.workers <= 16:
        problems.append("--workers must be 1 to 16")
    if args.max_tokens < 1:
        problems.append("--max-tokens must be >= 1")
    if args.gateway_config is not None and not args.gateway_config.is_file():
        problems.append(f"--gateway-config {args.gateway_config}: no such file")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run, print the table, write `--json`; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    problems = _problems(args)
    if problems:
        for problem in problems:
            print(f"chaos: error: {problem}", file=sys.stderr)
        return 2
    result = uvloop.run(run(args))
    print_table(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    if result["interrupted"]:
        return 130
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
