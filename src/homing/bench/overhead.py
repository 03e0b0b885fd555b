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
rounds, each phase taking the targets in turn (the order rotated by one each round, so that
with two gateways smg goes first in odd rounds), medians over the rounds reported:

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

Four more targets, each in the same interleaved rounds (every phase's order of targets
rotating by one each round):

- "homing_before" (`--homing-before-src DIR`, the `src` directory of an older homing
  checkout with its native modules and generated stubs built): the same `homing serve`
  command with `PYTHONPATH=DIR`, so that gateway runs the old code over the same workers;
  every figure homing has, and the ratio after/before (homing / homing_before);
- "homing_nometrics": the same `homing serve` with `[obs] request_metrics = false` (a TOML
  file in the scratch directory): no per-request Prometheus series (the log line, SLO
  bookkeeping and worker snapshots stay); every HTTP figure homing has, and the ratio
  metrics on/off (homing / homing_nometrics);
- "homing_si8": the same `homing serve` with `[engines] stream_interval = 8` (a TOML file in
  the scratch directory; the command-line flags override the rest of it): only the streamed
  CPU per token and the streamed first byte, set beside smg at stream_interval 1;
- "grpc_aio": no gateway, the floor under any Python gateway: a child process (this module,
  `python -m homing.bench.overhead _grpc-floor`) with one `grpc.aio` channel (homing's
  `DEFAULT_CHANNEL_OPTIONS`) to the first worker, under uvloop, running each CPU phase as the
  same engine calls (`build_generate_request`, 16 prompt tokens, temperature 0, ignore_eos,
  every message read): its own process CPU clock (all threads) per call, and per streamed
  message as the slope (cpu256 - cpu64) / (messages256 - messages64).

`--targets` picks some of them (DIRECT, the first-byte baseline, always runs).

Written: `--json` (every round's raw figures, the medians, the ratios, command, date,
machine) and a table on stdout: metric, homing, smg, homing/smg, homing_before,
after/before, homing without request metrics, metrics on/off, homing's gRPC API, grpc.aio
client alone; then the stream_interval 8 rows.

    python -m homing.bench.overhead --rounds 3 --json bench-out/overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
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
from homing.engines.client import DEFAULT_CHANNEL_OPTIONS, GenerateParams, build_generate_request
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
HOMING_BEFORE, HOMING_SI8, GRPC_FLOOR = "homing_before", "homing_si8", "grpc_aio"
HOMING_NOMETRICS = "homing_nometrics"
GATEWAYS = (HOMING, SMG, HOMING_BEFORE, HOMING_NOMETRICS)
"""The HTTP gateways measured in every phase, requests/s included."""
TARGETS = (HOMING, SMG, HOMING_BEFORE, HOMING_NOMETRICS, HOMING_GRPC, HOMING_SI8, GRPC_FLOOR)
"""Every target `--targets` may name, in the table's order."""
STREAMED_ONLY = frozenset({HOMING_SI8})
"""Targets measured only streamed (CPU per streamed request and token, streamed first byte)."""
SI8_STREAM_INTERVAL = 8
NOMETRICS_CONFIG = "[obs]\nrequest_metrics = false\n"
"""HOMING_NOMETRICS's `--config` file: homing without its per-request series."""
FLOOR_COMMAND = "_grpc-floor"
"""The hidden first argument that makes this module the grpc.aio floor's child process."""
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
    """Two instant workers, the selected gateways over them (and the grpc.aio floor's child),
    and this process's clients. `targets`: those of TARGETS to start; `before_src`: the old
    checkout's `src` directory for HOMING_BEFORE."""

    log_dir: Path
    targets: frozenset[str] = frozenset(TARGETS) - {HOMING_BEFORE}
    before_src: Path | None = None
    model: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    sims: list[asyncio.subprocess.Process] = field(default_factory=list)
    worker_urls: list[str] = field(default_factory=list)
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    http_urls: dict[str, str] = field(default_factory=dict)
    grpc_target: str = ""
    floor: FloorClient | None = None
    session: aiohttp.ClientSession | None = None
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    api_stub: api_grpc.InferenceStub | None = None
    worker_stubs: list[sgl_grpc.SglangSchedulerStub] = field(default_factory=list)
    _scratch: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        """Start everything and wait until every gateway serves the model over both workers.
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
        if GRPC_FLOOR in self.targets:
            self.floor = await FloorClient.spawn(
                self.worker_urls[0], self.prompt_ids, self.log_dir / f"{GRPC_FLOOR}.log"
            )
        si8_config = scratch / "homing-si8.toml"
        si8_config.write_text(f"[engines]\nstream_interval = {SI8_STREAM_INTERVAL}\n")
        nometrics_config = scratch / "homing-nometrics.toml"
        nometrics_config.write_text(NOMETRICS_CONFIG)
        async with asyncio.TaskGroup() as group:  # one failing stops the others' wait
            if self.targets & {HOMING, HOMING_GRPC}:
                group.create_task(self._start_homing(HOMING, scratch))
            if HOMING_BEFORE in self.targets:
                assert self.before_src is not None
                pythonpath = {"PYTHONPATH": str(self.before_src)}
                group.create_task(self._start_homing(HOMING_BEFORE, scratch, env=pythonpath))
            if HOMING_SI8 in self.targets:
                group.create_task(self._start_homing(HOMING_SI8, scratch, config=si8_config))
            if HOMING_NOMETRICS in self.targets:
                group.create_task(
                    self._start_homing(HOMING_NOMETRICS, scratch, config=nometrics_config)
                )
            if SMG in self.targets:
                group.create_task(self._start_smg(scratch / "smg"))
        for url in self.worker_urls:
            channel = grpc.aio.insecure_channel(url.removeprefix("grpc://"))
            self.channels.append(channel)
            self.worker_stubs.append(sgl_grpc.SglangSchedulerStub(channel))
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            connector=aiohttp.TCPConnector(limit=0),
        )
        if self.grpc_target:
            channel = grpc.aio.insecure_channel(self.grpc_target)
            self.channels.append(channel)
            self.api_stub = api_grpc.InferenceStub(channel)

    async def _start_homing(
        self,
        name: str,
        scratch: Path,
        env: dict[str, str] | None = None,
        config: Path | None = None,
    ) -> None:
        """`homing serve` over the workers as `name`: `env` added to ours, `config` its
        `--config` (the flags given here override what it says)."""
        port, grpc_port = free_port(), free_port()
        argv = [
            sys.executable, "-m", "homing", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", str(grpc_port), "--policy", "round_robin", "--log-level", "warning",
        ]  # fmt: skip
        if config is not None:
            argv += ["--config", str(config)]
        for url in self.worker_urls:
            argv += ["--worker", url]
        state = scratch / f"{name}-state"  # its own admin socket, whatever else runs here
        state.mkdir()
        await self._spawn(
            name, argv, env={**os.environ, "HOMING_STATE_DIR": str(state), **(env or {})}, cwd=None
        )
        self.http_urls[name] = f"http://127.0.0.1:{port}"
        if name == HOMING:
            self.grpc_target = f"127.0.0.1:{grpc_port}"

        async def ready(http: aiohttp.ClientSession) -> bool:
            return await self._homing_ready(http, name)

        await _wait_until(self.procs[name], self.log_dir / f"{name}.log", ready)

    async def _start_smg(self, cwd: Path) -> None:
        config_dir = cwd / model_spec(SIM_MODEL).hf_path  # the workers' tokenizer_path
        config_dir.mkdir(parents=True)
        (config_dir / "config.json").write_text(json.dumps(SMG_MODEL_CONFIG))
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

    async def _homing_ready(self, http: aiohttp.ClientSession, name: str) -> bool:
        base = self.http_urls[name]
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
        """The process whose CPU a target's requests cost (homing for its gRPC API too, the
        floor's child for GRPC_FLOOR)."""
        if target == GRPC_FLOOR:
            assert self.floor is not None
            return self.floor.proc.pid
        return self.procs[HOMING if target == HOMING_GRPC else target].pid

    def worker_cpu_s(self) -> float:
        """CPU seconds of both workers so far."""
        return sum(cpu_seconds(p.pid) for p in self.sims)

    async def stop(self) -> None:
        """Close the clients, stop the gateways and the floor's child, then the workers
        (SIGTERM, SIGKILL after 10 s)."""
        if self.session is not None:
            await self.session.close()
        for channel in self.channels:
            with contextlib.suppress(Exception):
                await channel.close()
        children = list(self.procs.values())
        if self.floor is not None:
            children.append(self.floor.proc)
        await terminate(children, grace_s=10)
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


# ============================================================================ the grpc.aio floor


@dataclass
class FloorClient:
    """The grpc.aio floor's child process as this one drives it: one JSON line a phase on
    its stdin, one JSON line of results back on its stdout (`floor_phase`'s)."""

    proc: asyncio.subprocess.Process
    log_path: Path

    @classmethod
    async def spawn(cls, worker_url: str, prompt_ids: Sequence[int], log_path: Path) -> FloorClient:
        """Start `python -m homing.bench.overhead _grpc-floor` against `worker_url` and wait
        until its channel is connected. RuntimeError (with the log) when it fails."""
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "homing.bench.overhead", FLOOR_COMMAND,
                "--worker", worker_url, "--prompt-ids", json.dumps(list(prompt_ids)),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
            )  # fmt: skip
        client = cls(proc, log_path)
        try:
            await asyncio.wait_for(client._read(), READY_TIMEOUT_S)
        except BaseException:
            await terminate([proc], grace_s=2)
            raise
        return client

    async def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            code = await self.proc.wait()
            raise RuntimeError(f"the grpc.aio floor exited with {code}; see {self.log_path}")
        result: dict[str, Any] = json.loads(line)
        return result

    async def phase(
        self, max_tokens: int, stream: bool, requests: int, concurrency: int
    ) -> dict[str, Any]:
        """`requests` Generate calls of `max_tokens` at `concurrency` in the child: its
        "good", "errors", "error_samples", "cpu_s" (its process clock), "wall_s",
        "messages" (read by the good calls)."""
        assert self.proc.stdin is not None
        command = {"tokens": max_tokens, "stream": stream, "requests": requests}
        self.proc.stdin.write((json.dumps({**command, "concurrency": concurrency}) + "\n").encode())
        await self.proc.stdin.drain()
        return await asyncio.wait_for(
            self._read(), REQUEST_TIMEOUT_S * (requests // concurrency + 1)
        )


def process_cpu_s() -> float:
    """CPU seconds of this process, all its threads (grpc's own included)."""
    return time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)


async def floor_serve(worker_url: str, prompt_ids: list[int]) -> None:
    """The floor's child: one grpc.aio channel to `worker_url`, "ready" on stdout once it is
    connected, then one phase per stdin line ({"tokens", "stream", "requests",
    "concurrency"}) and its result line on stdout, until stdin ends."""
    channel = grpc.aio.insecure_channel(
        worker_url.removeprefix("grpc://"), options=list(DEFAULT_CHANNEL_OPTIONS)
    )
    stub = sgl_grpc.SglangSchedulerStub(channel)
    await asyncio.wait_for(channel.channel_ready(), READY_TIMEOUT_S)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    ids = itertools.count()
    prefix = f"bench-overhead-floor-{os.getpid()}"

    async def call(max_tokens: int, stream: bool) -> tuple[int, str | None]:
        params = GenerateParams(
            request_id=f"{prefix}-{next(ids)}", input_ids=prompt_ids,
            max_new_tokens=max_tokens, temperature=0.0, ignore_eos=True, stream=stream,
        )  # fmt: skip
        messages, last = 0, None
        async for message in stub.Generate(
            build_generate_request(params), timeout=REQUEST_TIMEOUT_S
        ):
            messages += 1
            last = message
        if last is None or last.WhichOneof("response") != "complete":
            return messages, "the stream did not end with its complete message"
        return messages, _check_usage(last.complete.completion_tokens, max_tokens)

    def emit(line: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()

    emit({"ready": True})
    while line := await reader.readline():
        command = json.loads(line)
        emit(
            await floor_phase(
                call, int(command["tokens"]), bool(command["stream"]),
                int(command["requests"]), int(command["concurrency"]),
            )
        )  # fmt: skip
    await channel.close()


async def floor_phase(
    call: Callable[[int, bool], Awaitable[tuple[int, str | None]]],
    max_tokens: int,
    stream: bool,
    requests: int,
    concurrency: int,
) -> dict[str, Any]:
    """`requests` calls at `concurrency`, this process's CPU clock around them alone: "good",
    "errors", "error_samples" (up to 5 distinct), "cpu_s", "wall_s", "messages" (read by
    the good calls)."""
    remaining, good, messages = requests, 0, 0
    errors: list[str] = []

    async def worker() -> None:
        nonlocal remaining, good, messages
        while remaining > 0:
            remaining -= 1
            try:
                count, error = await call(max_tokens, stream)
            except grpc.aio.AioRpcError as exc:
                count, error = 0, f"AioRpcError: {exc.code().name} {exc.details()}"[:200]
            if error is None:
                good += 1
                messages += count
            else:
                errors.append(error)

    cpu0, wall0 = process_cpu_s(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = process_cpu_s() - cpu0, time.perf_counter() - wall0
    return {
        "good": good, "errors": len(errors), "error_samples": sorted(set(errors))[:5],
        "cpu_s": cpu, "wall_s": wall, "messages": messages,
    }  # fmt: skip


def floor_main(argv: Sequence[str]) -> int:
    """`python -m homing.bench.overhead _grpc-floor --worker URL --prompt-ids JSON`."""
    p = argparse.ArgumentParser(prog=f"python -m homing.bench.overhead {FLOOR_COMMAND}")
    p.add_argument("--worker", required=True, help="grpc://HOST:PORT of an instant worker")
    p.add_argument("--prompt-ids", required=True, help="the prompt's token ids, a JSON list")
    args = p.parse_args(argv)
    uvloop.run(floor_serve(args.worker, [int(i) for i in json.loads(args.prompt_ids)]))
    return 0


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
    """`requests` requests at `concurrency`: gateway and workers' CPU per good request (ms).
    For GRPC_FLOOR the "gateway" is the floor's child, its CPU from its own process clock
    over the calls alone, and "messages_per_call" is added."""
    stack = client.stack
    if target == GRPC_FLOOR:
        return await _floor_cpu_phase(client, errors, max_tokens, stream, requests, concurrency)
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
    ("CPU per streamed message (us, slope 64 -> 256)", "cpu_us_per_streamed_message",
     ("cpu_us_per_streamed_message", "{t}")),
)  # fmt: skip
"""(table label, JSON key, path into a round with "{t}" for the target)."""

FLOOR_METRICS = frozenset({
    "cpu_ms_non_streamed", "cpu_us_per_streamed_token", "cpu_ms_streamed_64",
    "cpu_ms_streamed_256", "workers_cpu_ms_non_streamed", "cpu_us_per_streamed_message",
    "peak_rss_mib",
})  # fmt: skip
"""The metrics the grpc.aio floor has (its "gateway" CPU is the bare client's)."""
SI8_METRICS = (
    ("cpu_us_per_streamed_token", "CPU per streamed token at stream_interval 8 (us, slope)"),
    ("cpu_ms_streamed_64", "CPU per streamed request at stream_interval 8, 64 tok (ms)"),
    ("cpu_ms_streamed_256", "CPU per streamed request at stream_interval 8, 256 tok (ms)"),
    ("added_p50_ms_streamed", "added first byte p50 at stream_interval 8, streamed (ms)"),
    ("added_p99_ms_streamed", "added first byte p99 at stream_interval 8, streamed (ms)"),
    ("peak_rss_mib", "peak RSS at stream_interval 8 (MiB)"),
)
"""(JSON key, table label) of the rows homing at stream_interval 8 gets beside smg at 1."""


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 3) if top is not None and bottom else None


def summarize(rounds: Sequence[dict[str, Any]], rss: dict[str, float]) -> dict[str, Any]:
    """Medians over the rounds per metric and target, the ratios (homing/smg, after/before =
    homing/homing_before, metrics on/off = homing/homing_nometrics, homing_si8/smg), the
    direct gRPC baseline."""
    medians: dict[str, dict[str, float | None]] = {}
    for _, key, path in METRICS:
        medians[key] = {t: _median(rounds, *(p.format(t=t) for p in path)) for t in TARGETS}
    medians["peak_rss_mib"] = {t: rss.get(t) for t in TARGETS}
    ratios, after_before, metrics, si8 = {}, {}, {}, {}
    for key, values in medians.items():
        ratios[key] = _ratio(values.get(HOMING), values.get(SMG))
        after_before[key] = _ratio(values.get(HOMING), values.get(HOMING_BEFORE))
        metrics[key] = _ratio(values.get(HOMING), values.get(HOMING_NOMETRICS))
    for key, _ in SI8_METRICS:
        si8[key] = _ratio(medians[key].get(HOMING_SI8), medians[key].get(SMG))
    baseline = {
        f"direct_{kind}_{q}_ms": _median(rounds, f"first_byte_{kind}", DIRECT, f"{q}_ms")
        for kind in ("non_streamed", "streamed")
        for q in ("p50", "p99")
    }
    return {
        "medians": medians,
        "ratios": ratios,
        "ratios_after_before": after_before,
        "ratios_metrics_on_off": metrics,
        "ratios_si8_to_smg_si1": si8,
        "direct_grpc_baseline": baseline,
    }


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
        rss = {name: peak_rss_mib(proc.pid) for name, proc in stack.procs.items()}
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
            "si8_stream_interval": SI8_STREAM_INTERVAL,
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


def print_table(result: dict[str, Any]) -> None:
    """The medians as a rich table on stdout; the stream_interval 8 rows in a section of
    their own (homing at 8 in the homing column, smg at 1 in smg's)."""
    from rich.console import Console
    from rich.table import Table

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"

    settings = result["settings"]
    targets = set(settings["targets"])
    table = Table(
        title=f"gateway overhead, median of {settings['rounds']} rounds "
        f"(2 instant workers, round robin; {result['machine']['cpu_model']}, "
        f"{result['machine']['cores']} cores)",
        title_justify="left",
    )
    before = HOMING_BEFORE in targets
    nometrics = HOMING_NOMETRICS in targets
    homing = bool(targets & {HOMING, HOMING_SI8})  # the si8 rows use its column
    before_name = f"homing before ({settings['homing_before_commit'] or 'old src'})"
    columns = [
        ("metric", True), ("homing", homing), ("smg", SMG in targets),
        ("homing/smg", homing and SMG in targets),
        (before_name, before), ("after/before", before),
        ("homing, no request metrics", nometrics), ("metrics on/off", nometrics and homing),
        ("homing gRPC API", HOMING_GRPC in targets),
        ("grpc.aio client alone", GRPC_FLOOR in targets),
    ]  # fmt: skip
    shown = [present for _, present in columns]
    for name, present in columns:
        if present:
            metric = name == "metric"
            table.add_column(name, justify="left" if metric else "right", no_wrap=metric)

    def add(cells: list[str]) -> None:
        table.add_row(*(c for c, present in zip(cells, shown, strict=True) if present))

    medians, ratios, after_before, on_off = (
        result["medians"], result["ratios"], result["ratios_after_before"],
        result["ratios_metrics_on_off"],
    )  # fmt: skip
    labels = [(label, key) for label, key, _ in METRICS] + [("peak RSS (MiB)", "peak_rss_mib")]
    for label, key in labels:
        row = medians[key]
        if key == "cpu_us_per_streamed_message" and row.get(GRPC_FLOOR) is None:
            continue
        grpc_cell = cell(row.get(HOMING_GRPC)) if not key.startswith(("rps", "cpu_ms_c32")) else ""
        if key == "peak_rss_mib":
            grpc_cell = "(same process)"
        if key == "cpu_us_per_streamed_message":
            grpc_cell = ""
        floor_cell = cell(row.get(GRPC_FLOOR)) if key in FLOOR_METRICS else ""
        gateway = key != "cpu_us_per_streamed_message"
        add([
            label,
            cell(row.get(HOMING)) if gateway else "", cell(row.get(SMG)) if gateway else "",
            cell(ratios[key]) if gateway else "",
            cell(row.get(HOMING_BEFORE)) if gateway else "",
            cell(after_before[key]) if gateway else "",
            cell(row.get(HOMING_NOMETRICS)) if gateway else "",
            cell(on_off[key]) if gateway else "", grpc_cell, floor_cell,
        ])  # fmt: skip
    if HOMING_SI8 in targets:
        table.add_section()
        si8 = result["ratios_si8_to_smg_si1"]
        add([
            f"[i]homing at stream_interval {SI8_STREAM_INTERVAL} vs smg at stream_interval 1:[/i]",
            "[i]homing si8[/i]", "[i]smg si1[/i]", "[i]si8/si1[/i]", "", "", "", "", "", "",
        ])  # fmt: skip
        for key, label in SI8_METRICS:
            add([
                label,
                cell(medians[key].get(HOMING_SI8)), cell(medians[key].get(SMG)),
                cell(si8[key]), "", "", "", "", "", "",
            ])  # fmt: skip
    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough for one line a row
        console = Console(width=200)
    console.print(table)
    base = result["direct_grpc_baseline"]
    console.print(
        f"direct gRPC first byte (the baseline): non-streamed p50 "
        f"{cell(base['direct_non_streamed_p50_ms'])} ms, p99 "
        f"{cell(base['direct_non_streamed_p99_ms'])} ms; streamed p50 "
        f"{cell(base['direct_streamed_p50_ms'])} ms, p99 {cell(base['direct_streamed_p99_ms'])} ms"
    )
    if GRPC_FLOOR in targets:
        console.print(
            "grpc.aio client alone: one process, one grpc.aio channel to a worker, the same "
            "engine calls and no gateway; its own CPU (all threads) per call and per message"
        )
    counts = result["errors"]["counts"]
    console.print(
        "errors: " + (", ".join(f"{t} {n}" for t, n in counts.items()) if counts else "none")
        + f"; wall time {result['wall_s']:g} s; rps by {settings['rps_generator']}"
    )  # fmt: skip


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


if __name__ == "__main__":
    sys.exit(main())
