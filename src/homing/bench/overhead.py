"""`make bench-overhead`: what homing's gateway costs per request and per token, side by side
with smg (the Rust SGLang Model Gateway), in front of the same zero-latency workers.

Rule of this file: a measurement, not a test. Every party is its own process, so the client
work of this one is in nobody's figures: two instant simulated workers (`homing sim
--instant`: SGLang's gRPC protocol, every scheduler step zero time, one chunk per step), then
`homing serve --worker A --worker B --policy round_robin` and `smg launch --worker-urls A B
--policy round_robin`, both logging at warn level to files under `--log-dir`; both route the
same way and do no prefix work. smg fetches the tokenizer from a worker (GetTokenizer) and,
for each chat request, the model's config.json from the worker's `tokenizer_path` (a Hugging
Face id): it runs in a directory holding `<that id>/config.json`, so that lookup succeeds once
and is cached, as with a warm Hugging Face cache; offline it would be retried, and hang at
times, on every request.

Every request is the same OpenAI chat completion: one user message of 16 prompt tokens (with
the served chat template), temperature 0, `ignore_eos`, `max_tokens` N, so that exactly N
tokens come back. Only 200 answers whose usage says N completion tokens (streamed: and a
`[DONE]`) count; anything else is an error, counted and reported. Measured in `--rounds`
rounds, each phase alternating between the gateways (homing first in even rounds, smg in odd
ones), medians over the rounds reported:

- CPU per non-streamed request: utime + stime of the gateway process (all threads; read
  from the process's CPU-time clock, which /proc/PID/stat counts in 10 ms ticks, too coarse
  for smg's ~0.1 s a phase; the ticks are kept beside it as a check) over `--cpu-requests`
  requests of 16 tokens at concurrency
  `--concurrency`, divided by the requests; the two workers' CPU the same way;
- CPU per streamed token: CPU per streamed request at 64 and at 256 tokens (stream_interval
  1, so 64 and 256 chunks from the worker) and the slope (cpu256 - cpu64) / 192;
- requests/s at concurrency 32, non-streamed, 16 tokens, for `--rps-seconds` by wrk (Debian's
  `wrk`, one thread, a Lua script that posts the body and counts good answers; an aiohttp
  client of the same shape where wrk is missing), and the gateway's CPU per request then;
- added first-byte latency at concurrency 1 (p50, p99, ms): send to the first byte of the
  answer body (non-streamed: the whole body read; streamed: the first SSE event carrying
  generated text), minus the same for a direct gRPC Generate to a worker (non-streamed: the
  `complete`; streamed: the first chunk with a token), one request to each target in turn;
- peak RSS of each gateway at the end (VmHWM from /proc/PID/status);
- homing's own gRPC API (`homing.v1.Inference/ChatCompletion`): the same CPU per request, CPU
  per token and first-byte figures (smg has no such API).

Written: `--json` (every round's raw figures, the medians, the homing/smg ratios, command,
date, machine) and a table on stdout: metric, homing, smg, homing/smg, homing's gRPC API.

    python -m homing.bench.overhead --rounds 3 --json bench-out/overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import uvloop
from smg_grpc_proto.generated import sglang_scheduler_pb2 as sgl
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgl_grpc

from homing.bench.report import percentile
from homing.bench.routers import free_port
from homing.bench.sse import SseDecoder
from homing.sim.process import spawn_sim, terminate
from homing.sim.timing import model_spec
from homing.text.served import load_served_tokenizer
from homing.v1 import inference_pb2 as api
from homing.v1 import inference_pb2_grpc as api_grpc

PROMPT_TEXT = "Tell me a short story about a clever fox that lives in the"
"""The user message: 16 prompt tokens with the served tokenizer's chat template."""

SIM_MODEL = "llama-3.1-8b"
SMG_MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
"""The config.json smg finds for the workers' model: what their GetModelInfo reports."""
NON_STREAMED_TOKENS = 16
STREAMED_TOKENS = (64, 256)
RPS_CONCURRENCY = 32
HOMING, SMG, HOMING_GRPC, DIRECT = "homing", "smg", "homing_grpc", "direct"
GATEWAYS = (HOMING, SMG)
CLK_TCK = os.sysconf("SC_CLK_TCK")
USAGE_OBJECT = re.compile(r'"usage":\s*\{')
"""An SSE chunk carrying a usage object (not `"usage": null`)."""
READY_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 60.0


# ============================================================================ /proc


def cpu_seconds(pid: int) -> float:
    """CPU time of process `pid`, all its threads, exited ones included (s, ns resolution):
    Linux's CPU-time clock of that process (clock id `(~pid << 3) | 2`, CPUCLOCK_SCHED of
    MAKE_PROCESS_CPUCLOCK in linux/posix-timers.h), the utime + stime that /proc/PID/stat
    counts in 10 ms ticks (`stat_cpu_seconds`). Falls back to those ticks where the clock
    cannot be read."""
    try:
        return time.clock_gettime_ns((~pid << 3) | 2) / 1e9
    except OSError:
        return stat_cpu_seconds(pid)


def stat_cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, all its threads (s, in clock ticks of 1 / CLK_TCK):
    fields 14 and 15 of /proc/PID/stat, counted after the parenthesised command name."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def peak_rss_mib(pid: int) -> float:
    """VmHWM of process `pid` (MiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def machine() -> dict[str, Any]:
    """platform, /proc/cpuinfo model name and core count of this machine."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"platform": platform.platform(), "cpu_model": model, "cores": os.cpu_count()}


# ============================================================================ the processes


@dataclass
class Stack:
    """Two instant workers, homing and smg over them, and this process's clients."""

    log_dir: Path
    model: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    sims: list[asyncio.subprocess.Process] = field(default_factory=list)
    worker_urls: list[str] = field(default_factory=list)
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    http_urls: dict[str, str] = field(default_factory=dict)
    grpc_target: str = ""
    session: aiohttp.ClientSession | None = None
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    api_stub: api_grpc.InferenceStub | None = None
    worker_stubs: list[sgl_grpc.SglangSchedulerStub] = field(default_factory=list)
    _scratch: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        """Start everything and wait until both gateways serve the model over both workers.
        Raises RuntimeError (with the log to read) when a process fails to come up."""
        # Every process is started before this one opens a gRPC channel: a fork while grpc's
        # threads run skips grpc's fork handlers (and logs that it did).
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._scratch = tempfile.TemporaryDirectory(prefix="homing-overhead-")
        scratch = Path(self._scratch.name)
        sim_args = ["--instant", "--model", SIM_MODEL, "--port", "0"]
        for i in range(2):
            with (self.log_dir / f"sim-{i}.log").open("wb") as log:
                proc, ready = await spawn_sim(
                    [*sim_args, "--parent-pid", str(os.getpid())], stderr=log.fileno()
                )
            self.sims.append(proc)
            self.worker_urls.append(ready["workers"][0]["url"])
        self.model = SIM_MODEL
        self.prompt_ids = load_served_tokenizer().encode_chat(
            [{"role": "user", "content": PROMPT_TEXT}]
        )
        smg_cwd = scratch / "smg"
        config_dir = smg_cwd / model_spec(SIM_MODEL).hf_path  # the workers' tokenizer_path
        config_dir.mkdir(parents=True)
        (config_dir / "config.json").write_text(json.dumps(SMG_MODEL_CONFIG))
        async with asyncio.TaskGroup() as group:  # one failing stops the other's wait
            group.create_task(self._start_homing(scratch))
            group.create_task(self._start_smg(smg_cwd))
        for url in self.worker_urls:
            channel = grpc.aio.insecure_channel(url.removeprefix("grpc://"))
            self.channels.append(channel)
            self.worker_stubs.append(sgl_grpc.SglangSchedulerStub(channel))
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            connector=aiohttp.TCPConnector(limit=0),
        )
        channel = grpc.aio.insecure_channel(self.grpc_target)
        self.channels.append(channel)
        self.api_stub = api_grpc.InferenceStub(channel)

    async def _start_homing(self, scratch: Path) -> None:
        port, grpc_port = free_port(), free_port()
        argv = [
            sys.executable, "-m", "homing", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", str(grpc_port), "--policy", "round_robin", "--log-level", "warning",
        ]  # fmt: skip
        for url in self.worker_urls:
            argv += ["--worker", url]
        state = scratch / "homing-state"  # its own admin socket, whatever else runs here
        state.mkdir()
        env = {**os.environ, "HOMING_STATE_DIR": str(state)}
        await self._spawn(HOMING, argv, env=env, cwd=None)
        self.http_urls[HOMING] = f"http://127.0.0.1:{port}"
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        await _wait_until(self.procs[HOMING], self.log_dir / "homing.log", self._homing_ready)

    async def _start_smg(self, cwd: Path) -> None:
        port = free_port()
        binary = shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")
        if binary is None:
            raise RuntimeError("smg is not installed (`pip install -e '.[test]'` brings it)")
        argv = [
            binary, "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *self.worker_urls, "--policy", "round_robin",
            "--log-level", "warn", "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()),
        ]  # fmt: skip
        await self._spawn(SMG, argv, env=None, cwd=cwd)
        self.http_urls[SMG] = f"http://127.0.0.1:{port}"
        await _wait_until(self.procs[SMG], self.log_dir / "smg.log", self._smg_ready)

    async def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None, cwd: Path | None
    ) -> None:
        with (self.log_dir / f"{name}.log").open("wb") as log:
            self.procs[name] = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=cwd
            )

    async def _models(self, http: aiohttp.ClientSession, base: str) -> set[str]:
        async with http.get(f"{base}/v1/models") as resp:
            if resp.status != 200:
                return set()
            return {m["id"] for m in (await resp.json())["data"]}

    async def _homing_ready(self, http: aiohttp.ClientSession) -> bool:
        base = self.http_urls[HOMING]
        async with http.get(f"{base}/ready") as resp:
            if resp.status != 200:
                return False
        return self.model in await self._models(http, base)

    async def _smg_ready(self, http: aiohttp.ClientSession) -> bool:
        base = self.http_urls[SMG]
        async with http.get(f"{base}/readiness") as resp:
            if resp.status != 200 or (await resp.json()).get("healthy_workers") != 2:
                return False
        return self.model in await self._models(http, base)

    def gateway_pid(self, target: str) -> int:
        """The process whose CPU a target's requests cost (homing for its gRPC API too)."""
        return self.procs[SMG if target == SMG else HOMING].pid

    def worker_cpu_s(self) -> float:
        """CPU seconds of both workers so far."""
        return sum(cpu_seconds(p.pid) for p in self.sims)

    async def stop(self) -> None:
        """Close the clients, stop the gateways, then the workers (SIGTERM, SIGKILL after 10 s)."""
        if self.session is not None:
            await self.session.close()
        for channel in self.channels:
            with contextlib.suppress(Exception):
                await channel.close()
        await terminate(list(self.procs.values()), grace_s=10)
        await terminate(self.sims, grace_s=10)
        if self._scratch is not None:
            self._scratch.cleanup()


async def _wait_until(
    proc: asyncio.subprocess.Process,
    log_path: Path,
    ready: Callable[[aiohttp.ClientSession], Awaitable[bool]],
) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"exited with {proc.returncode} before ready; see {log_path}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if await ready(http):
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"not ready within {READY_TIMEOUT_S:g} s; see {log_path}")


# ============================================================================ one request


def chat_body(model: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """The OpenAI chat body every HTTP request sends."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT_TEXT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


class Client:
    """One request of each kind to each target; each returns (seconds from send to first
    byte, None) for a good answer or (seconds, error text) otherwise."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self._next_worker = 0
        self._rid = 0

    async def request(self, target: str, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        """One request to `target` (HOMING, SMG, HOMING_GRPC or DIRECT)."""
        try:
            if target == DIRECT:
                return await self._direct(max_tokens, stream)
            if target == HOMING_GRPC:
                return await self._api(max_tokens, stream)
            return await self._http(target, max_tokens, stream)
        except (aiohttp.ClientError, grpc.aio.AioRpcError, TimeoutError, ValueError) as exc:
            return 0.0, f"{type(exc).__name__}: {str(exc)[:200]}"

    async def _http(self, target: str, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        session = self.stack.session
        assert session is not None
        url = self.stack.http_urls[target] + "/v1/chat/completions"
        body = json.dumps(chat_body(self.stack.model, max_tokens, stream)).encode()
        headers = {"Content-Type": "application/json"}
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as resp:
            if not stream:
                data = await resp.read()
                first = time.perf_counter() - started
                if resp.status != 200:
                    return first, f"HTTP {resp.status}: {data[:200]!r}"
                usage = json.loads(data).get("usage") or {}
                return first, _check_usage(usage.get("completion_tokens"), max_tokens)
            if resp.status != 200:
                return time.perf_counter() - started, f"HTTP {resp.status}"
            decoder = SseDecoder()
            first_s: float | None = None
            usage: dict[str, Any] = {}
            done = False
            async for piece in resp.content.iter_any():
                for event in decoder.feed(piece):
                    if event == "[DONE]":
                        done = True
                        continue
                    if first_s is not None and not USAGE_OBJECT.search(event):
                        continue  # text after the first: not parsed (client work kept small)
                    chunk = json.loads(event)
                    if first_s is None and any(
                        (choice.get("delta") or {}).get("content")
                        for choice in chunk.get("choices") or ()
                    ):
                        first_s = time.perf_counter() - started
                    usage = chunk.get("usage") or usage
        if first_s is None:
            return 0.0, "no event carried text"
        if not done:
            return first_s, "no data: [DONE]"
        return first_s, _check_usage(usage.get("completion_tokens"), max_tokens)

    async def _api(self, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        stub = self.stack.api_stub
        assert stub is not None
        request = api.ChatCompletionRequest(
            model=self.stack.model,
            messages=[api.ChatMessage(role="user", content=PROMPT_TEXT)],
            sampling=api.SamplingOptions(max_tokens=max_tokens, temperature=0, ignore_eos=True),
            stream=stream,
        )
        started = time.perf_counter()
        first_s: float | None = None
        completion: int | None = None
        async for message in stub.ChatCompletion(request, timeout=REQUEST_TIMEOUT_S):
            if first_s is None and (not stream or any(c.text for c in message.choices)):
                first_s = time.perf_counter() - started
            if message.HasField("usage"):
                completion = message.usage.completion_tokens
        if first_s is None:
            return 0.0, "no message carried text"
        return first_s, _check_usage(completion, max_tokens)

    async def _direct(self, max_tokens: int, stream: bool) -> tuple[float, str | None]:
        stubs = self.stack.worker_stubs
        stub = stubs[self._next_worker % len(stubs)]
        self._next_worker += 1
        self._rid += 1
        request = sgl.GenerateRequest(
            request_id=f"bench-overhead-{os.getpid()}-{self._rid}",
            tokenized=sgl.TokenizedInput(input_ids=self.stack.prompt_ids),
            sampling_params=sgl.SamplingParams(
                temperature=0.0, max_new_tokens=max_tokens, ignore_eos=True
            ),
            stream=stream,
        )
        started = time.perf_counter()
        first_s: float | None = None
        completion: int | None = None
        async for message in stub.Generate(request, timeout=REQUEST_TIMEOUT_S):
            kind = message.WhichOneof("response")
            if first_s is None and (
                kind == "complete" or (kind == "chunk" and message.chunk.token_ids)
            ):
                first_s = time.perf_counter() - started
            if kind == "complete":
                completion = message.complete.completion_tokens
        if first_s is None:
            return 0.0, "no message carried a token"
        return first_s, _check_usage(completion, max_tokens)


def _check_usage(completion_tokens: object, expected: int) -> str | None:
    if completion_tokens != expected:
        return f"usage says {completion_tokens!r} completion tokens, not {expected}"
    return None


# ============================================================================ the phases


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
    """`requests` requests at `concurrency`: gateway and workers' CPU per good request (ms)."""
    stack = client.stack
    pid = stack.gateway_pid(target)
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

    ticks0, gateway0 = stat_cpu_seconds(pid), cpu_seconds(pid)
    workers0, wall0 = stack.worker_cpu_s(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - wall0
    gateway, workers = cpu_seconds(pid) - gateway0, stack.worker_cpu_s() - workers0
    ticks = stat_cpu_seconds(pid) - ticks0
    per = max(good, 1)
    return {
        "requests": good,
        "errors": requests - good,
        "wall_s": round(wall, 3),
        "gateway_cpu_ms": round(gateway * 1e3 / per, 4),
        "gateway_cpu_ms_from_ticks": round(ticks * 1e3 / per, 4),
        "workers_cpu_ms": round(workers * 1e3 / per, 4),
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
    pid = stack.gateway_pid(target)
    gateway0 = cpu_seconds(pid)
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
    gateway = cpu_seconds(pid) - gateway0
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


# ============================================================================ the run


async def run_round(
    client: Client, errors: Errors, args: argparse.Namespace, index: int, wrk: str | None,
    script: Path,
) -> dict[str, Any]:  # fmt: skip
    """One round of every phase, gateways alternating (smg first in odd rounds)."""
    order = list(GATEWAYS) if index % 2 == 0 else list(reversed(GATEWAYS))
    cpu_targets = [*order, HOMING_GRPC]
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
        for target in cpu_targets:
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
        for target in cpu_targets
    }
    out["rps"] = {}
    for target in order:
        out["rps"][target] = await rps_phase(client, errors, target, args.rps_seconds, wrk, script)
    targets = [DIRECT, *order, HOMING_GRPC]
    out["first_byte_non_streamed"] = await first_byte_phase(
        client, errors, targets, False, args.latency_requests
    )
    out["first_byte_streamed"] = await first_byte_phase(
        client, errors, targets, True, args.latency_requests
    )
    return out


def _median(rounds: Sequence[dict[str, Any]], *path: str) -> float | None:
    values = []
    for r in rounds:
        node: Any = r
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, int | float):
            values.append(float(node))
    return round(statistics.median(values), 4) if values else None


METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("gateway CPU per non-streamed request (ms, 16 tokens)", "cpu_ms_non_streamed",
     ("non_streamed", "{t}", "gateway_cpu_ms")),
    ("gateway CPU per streamed token (us, slope 64 -> 256)", "cpu_us_per_streamed_token",
     ("cpu_us_per_streamed_token", "{t}")),
    ("gateway CPU per streamed request, 64 tokens (ms)", "cpu_ms_streamed_64",
     ("streamed_64", "{t}", "gateway_cpu_ms")),
    ("gateway CPU per streamed request, 256 tokens (ms)", "cpu_ms_streamed_256",
     ("streamed_256", "{t}", "gateway_cpu_ms")),
    ("requests/s at concurrency 32 (non-streamed)", "rps_c32", ("rps", "{t}", "rps")),
    ("gateway CPU per request at concurrency 32 (ms)", "cpu_ms_c32",
     ("rps", "{t}", "gateway_cpu_ms")),
    ("added first byte p50, non-streamed (ms)", "added_p50_ms_non_streamed",
     ("first_byte_non_streamed", "{t}", "added_p50_ms")),
    ("added first byte p99, non-streamed (ms)", "added_p99_ms_non_streamed",
     ("first_byte_non_streamed", "{t}", "added_p99_ms")),
    ("added first byte p50, streamed (ms)", "added_p50_ms_streamed",
     ("first_byte_streamed", "{t}", "added_p50_ms")),
    ("added first byte p99, streamed (ms)", "added_p99_ms_streamed",
     ("first_byte_streamed", "{t}", "added_p99_ms")),
    ("workers' CPU per non-streamed request (ms)", "workers_cpu_ms_non_streamed",
     ("non_streamed", "{t}", "workers_cpu_ms")),
)  # fmt: skip
"""(table label, JSON key, path into a round with "{t}" for the target)."""


def summarize(rounds: Sequence[dict[str, Any]], rss: dict[str, float]) -> dict[str, Any]:
    """Medians over the rounds per metric and target, the homing/smg ratios, the baseline."""
    medians: dict[str, dict[str, float | None]] = {}
    for _, key, path in METRICS:
        medians[key] = {
            t: _median(rounds, *(p.format(t=t) for p in path)) for t in (*GATEWAYS, HOMING_GRPC)
        }
    medians["peak_rss_mib"] = {t: rss.get(t) for t in (*GATEWAYS, HOMING_GRPC)}
    ratios = {}
    for key, values in medians.items():
        homing, smg = values.get(HOMING), values.get(SMG)
        ratios[key] = round(homing / smg, 3) if homing is not None and smg else None
    baseline = {
        f"direct_{kind}_{q}_ms": _median(rounds, f"first_byte_{kind}", DIRECT, f"{q}_ms")
        for kind in ("non_streamed", "streamed")
        for q in ("p50", "p99")
    }
    return {"medians": medians, "ratios": ratios, "direct_grpc_baseline": baseline}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, run the rounds, stop everything; the result as a JSON-able dict."""
    stack = Stack(log_dir=args.log_dir)
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
        for target in (*GATEWAYS, HOMING_GRPC, DIRECT):  # warm-up: connections, caches
            for stream in (False, True):
                for _ in range(args.warmup):
                    _, error = await client.request(target, NON_STREAMED_TOKENS, stream)
                    if error is not None:
                        raise RuntimeError(f"{target} fails at warm-up: {error}")
        for index in range(args.rounds):
            rounds.append(await run_round(client, errors, args, index, wrk, script))
            print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        rss = {HOMING: peak_rss_mib(stack.procs[HOMING].pid)}
        rss[SMG] = peak_rss_mib(stack.procs[SMG].pid)
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


def print_table(result: dict[str, Any]) -> None:
    """The medians as a rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"

    settings = result["settings"]
    table = Table(
        title=f"gateway overhead, median of {settings['rounds']} rounds "
        f"(2 instant workers, round robin; {result['machine']['cpu_model']}, "
        f"{result['machine']['cores']} cores)",
        title_justify="left",
    )
    for name in ("metric", "homing", "smg", "homing/smg", "homing gRPC API"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    medians, ratios = result["medians"], result["ratios"]
    labels = [(label, key) for label, key, _ in METRICS] + [("peak RSS (MiB)", "peak_rss_mib")]
    for label, key in labels:
        row = medians[key]
        grpc_cell = cell(row.get(HOMING_GRPC)) if not key.startswith(("rps", "cpu_ms_c32")) else ""
        if key == "peak_rss_mib":
            grpc_cell = "(same process)"
        table.add_row(label, cell(row[HOMING]), cell(row[SMG]), cell(ratios[key]), grpc_cell)
    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough for one line a row
        console = Console(width=130)
    console.print(table)
    base = result["direct_grpc_baseline"]
    console.print(
        f"direct gRPC first byte (the baseline): non-streamed p50 "
        f"{cell(base['direct_non_streamed_p50_ms'])} ms, p99 "
        f"{cell(base['direct_non_streamed_p99_ms'])} ms; streamed p50 "
        f"{cell(base['direct_streamed_p50_ms'])} ms, p99 {cell(base['direct_streamed_p99_ms'])} ms"
    )
    counts = result["errors"]["counts"]
    console.print(
        "errors: " + (", ".join(f"{t} {n}" for t, n in counts.items()) if counts else "none")
        + f"; wall time {result['wall_s']:g} s; rps by {settings['rps_generator']}"
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The command-line options (defaults: ~3 minutes on 2 cores)."""
    p = argparse.ArgumentParser(
        prog="python -m homing.bench.overhead",
        description=__doc__.splitlines()[0] if __doc__ else None,
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
        "--log-dir", type=Path, default=Path("bench-out/overhead-logs"), help="processes' logs"
    )
    p.add_argument("--json", type=Path, help="write the result here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run, print the table, write `--json`."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    for name in ("rounds", "cpu_requests", "stream_requests", "concurrency", "latency_requests"):
        if getattr(args, name) < 1:
            print(f"--{name.replace('_', '-')} must be >= 1", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
