"""`make bench-routers`: homing's four routing policies and smg's cache_aware on one real trace,
against the same simulated workers, with the cache flushed between runs.

Rule of this file: the evaluation's shell (processes, sockets, clocks) plus two pure offline
figures. One invocation:

1. loads the first `--limit` requests of the Mooncake conversation trace (or `--trace`'s
   file, or with `--trace chat[:key=value,...]` the synthetic multi-tenant chat trace of
   `homing.bench.chat_trace`) and builds their prompts (`homing.bench.traces`,
   deterministic token ids);
2. computes offline (pure): the *bound*, the prefix-cache hit rate of one LRU cache with the
   pool's total KV capacity on the same requests in arrival order (prompt blocks only, each
   request's path touched leaf first; an upper bound: it ignores running requests' KV and
   cached outputs), and the *offered load* of round robin (below);
3. starts `--workers` simulated SGLang workers (`homing sim`, llama-3.1-70b on 8x H100 by
   default) at `--speedup`, split over `--sim-procs` processes;
4. for each run (homing round_robin, least_load, consistent_hash, cache_aware; then
   `smg launch --policy cache_aware --block-size 16`; a run named `smg_<policy>` runs smg
   with that policy; "POLICY@FILE" runs homing's POLICY with `--config FILE`, e.g. other
   `[router]` weights): flushes every worker's cache (FlushCache), starts the gateway as its
   own process, replays the trace open loop at `speed * speedup` wall speed (`speed` in
   trace time; each request with `x-request-id` "bench-<trace index>"), stops the gateway;
   with `--affinity`, follows every worker's KV events meanwhile and judges each decision
   against them (`homing.bench.affinity`: where the hits went);
5. prints one table, writes `bench-out/routers.json` (one object per run) and the markdown
   table for docs/benchmarks.md; with `--plot DIR`, the five `homing.bench.plots` PNGs with
   the runs side by side, in simulated time.

Time base: the sims run `speedup` times faster than the wall clock, so every duration the
client measures (TTFT, TPOT, run length) is multiplied by `speedup` to report simulated
milliseconds; goodput is per simulated second. The gateway's own overhead is scaled with it
(a few ms of wall time become `speedup` times more; noted in the output).

Offered load (a utilisation estimate, formula ours): with round robin's per-worker LRU
caches computed offline (capacity / workers each, request i on worker i mod n),
    work_i = prefill_time(P_i - C_i new tokens after C_i cached, 8192-token chunks)
             + D_i * decode_step(16, L_i) / 16
    load   = sum_i work_i / (n * T / speed)
with the sim's own roofline timing model, P_i / D_i the prompt / output tokens, C_i the
cached prefix, L_i = P_i + D_i / 2 the mean context, T the trace span. `--speed` 0 picks
the speed that makes `load` equal `--target-load` (0.70).

Per run: `hit_rate` = sum cached / sum prompt tokens (usage of completed requests),
`bound_fraction` = hit_rate / bound, TTFT p50/p95 and TPOT p95 (ms, simulated),
`goodput_rps` = requests with TTFT <= 2 s and TPOT <= 50 ms per simulated second,
`max_mean_load` = most requests on one worker / mean requests per worker, `errors`;
`ttft_mean_ms` as the client measured it and `engine_ttft_mean_ms` as the sims measured it
(arrival at the engine to the end of the first token's step): the difference is what the
gateway and the client add, scaled by `speedup` like every client-side time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from homing.bench.affinity import CacheChange, judge, markdown
from homing.bench.chat_trace import chat_requests, is_chat_spec
from homing.bench.kv_trace import KvTrace, homing_routes, request_id, routed_requests
from homing.bench.loadgen import completion_body
from homing.bench.records import RequestRecord
from homing.bench.report import Slo, summarize
from homing.bench.sse import CompletionStream, SseDecoder, copy_stream_fields
from homing.bench.traces import PromptBuilder, TraceRequest, load_trace
from homing.router.hashing import DEFAULT_HASH_SEED, block_hashes, root_hash
from homing.sim.metrics import scrape_total
from homing.sim.process import spawn_sim, terminate
from homing.sim.timing import TimingModel, resolve_limits

DEFAULT_TRACE = "../shared/traces/mooncake/conversation_trace.jsonl"
HOMING_POLICIES = ("round_robin", "least_load", "consistent_hash", "cache_aware")
BLOCK = 16
CHUNK = 8192
DECODE_REF_BATCH = 16


# ============================================================================ offline (pure)


def _keys(builder: PromptBuilder, request: TraceRequest, root: int) -> list[int]:
    return block_hashes(builder.prompt_ids(request), BLOCK, root)


def lru_hits(
    requests: Sequence[TraceRequest],
    builder: PromptBuilder,
    capacity_blocks: int,
    caches: int = 1,
) -> list[int]:
    """Cached prefix tokens of each request (arrival order) with `caches` LRU caches of
    `capacity_blocks` blocks each, request i going to cache i mod `caches`. A request's
    blocks are touched deepest first, so parents are evicted after their children."""
    root = root_hash(DEFAULT_HASH_SEED)
    lrus: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(caches)]
    hits: list[int] = []
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.index))
    for i, request in enumerate(ordered):
        lru = lrus[i % caches]
        keys = _keys(builder, request, root)
        matched = 0
        for key in keys:
            if key not in lru:
                break
            matched += 1
        hits.append(min(matched * BLOCK, request.prompt_tokens))
        for key in reversed(keys):
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return hits


def offered_load(
    requests: Sequence[TraceRequest],
    cached: Sequence[int],
    timing: TimingModel,
    workers: int,
    speed: float,
) -> float:
    """`load` of the module docstring for `requests` (arrival order) with `cached` prefix
    tokens each, on `workers` workers, replayed at `speed`."""
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.index))
    work = 0.0
    for request, hit in zip(ordered, cached, strict=True):
        prefill = timing.prefill_time_s(request.prompt_tokens - hit, hit, chunk_tokens=CHUNK)
        context = request.prompt_tokens + request.output_tokens // 2
        step = timing.decode_step_time_s(DECODE_REF_BATCH, context)
        work += prefill + request.output_tokens * step / DECODE_REF_BATCH
    span = max(r.arrival_s for r in ordered) - min(r.arrival_s for r in ordered)
    return work / (workers * span / speed)


# ============================================================================ SGLang /generate


class GenerateStream(CompletionStream):
    """Accumulates an SGLang-native `/generate` stream (what smg serves for token-id input):
    events `{"text", "output_ids", "meta_info": {prompt_tokens, completion_tokens,
    cached_tokens, finish_reason}}` then `data: [DONE]`. Framing and error handling are
    `homing.bench.sse.CompletionStream`'s; only the chunk shape differs."""

    def _fold(self, chunk: dict[str, Any], now: float) -> None:
        if chunk.get("output_ids"):
            if self.first_token_s is None:
                self.first_token_s = now
            self.last_token_s = now
        meta = chunk.get("meta_info") or {}
        if isinstance(meta, dict):
            self.prompt_tokens = meta.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = meta.get("completion_tokens", self.completion_tokens)
            self.cached_tokens = meta.get("cached_tokens", self.cached_tokens)
            reason = meta.get("finish_reason")
            if reason:
                self.finish_reason = reason if isinstance(reason, str) else str(reason)

    def verdict(self) -> str | None:  # type: ignore[override]
        """None for a complete stream, else what was wrong."""
        if self._error is not None:
            return self._error.message
        if self.completion_tokens is None or self.finish_reason is None:
            return "stream ended without a finished chunk"
        if not self.done:
            return "stream ended without data: [DONE]"
        return None


# ============================================================================ replay


@dataclass
class Target:
    """One gateway under test: base `url`, the request shape (`api` "openai" for homing's
    /v1/completions, "generate" for smg's /generate), its worker header and the model."""

    url: str
    api: str
    worker_header: str
    model: str


def _body(target: Target, prompt: list[int], max_tokens: int) -> bytes:
    if target.api == "openai":
        return completion_body(target.model, prompt, max_tokens)
    doc = {
        "model": target.model,
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


async def replay(
    target: Target,
    requests: Sequence[TraceRequest],
    builder: PromptBuilder,
    wall_speed: float,
    timeout_s: float,
) -> tuple[list[RequestRecord], float]:
    """Open-loop replay of `requests` at `wall_speed`; one record per request (wall s from
    the start), and the Unix time of the start. Each request carries `x-request-id`
    `kv_trace.request_id(index)`."""
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.index))
    bodies = [_body(target, builder.prompt_ids(r), r.output_tokens) for r in ordered]
    endpoint = target.url + ("/v1/completions" if target.api == "openai" else "/generate")
    base_headers = {"content-type": "application/json", "accept": "text/event-stream"}
    loop = asyncio.get_running_loop()
    records: list[RequestRecord] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        t0 = loop.time()
        started_at = time.time()

        async def one(body: bytes, rec: RequestRecord) -> None:
            headers = {**base_headers, "x-request-id": request_id(rec.index)}
            stream: CompletionStream | GenerateStream = (
                CompletionStream() if target.api == "openai" else GenerateStream()
            )
            decoder = SseDecoder()
            rec.send_s = loop.time() - t0
            try:
                async with (
                    asyncio.timeout(timeout_s),
                    session.post(endpoint, data=body, headers=headers) as resp,
                ):
                    rec.status = resp.status
                    rec.worker = resp.headers.get(target.worker_header)
                    if resp.status != 200:
                        rec.error_kind = f"http_{resp.status}"
                        rec.error = (await resp.text())[:300]
                        return
                    async for chunk in resp.content.iter_any():
                        now = loop.time() - t0
                        for data in decoder.feed(chunk):
                            stream.on_event(data, now)
            except TimeoutError:
                rec.error_kind, rec.error = "timeout", f"no complete response in {timeout_s} s"
            except (aiohttp.ClientError, OSError) as err:
                rec.error_kind, rec.error = "transport", f"{type(err).__name__}: {err}"
            finally:
                rec.end_s = loop.time() - t0
                copy_stream_fields(rec, stream)
            if rec.error is None:
                problem = stream.verdict()
                if problem is not None:
                    rec.error_kind = "stream"
                    rec.error = problem if isinstance(problem, str) else problem.message

        tasks = []
        for request, body in zip(ordered, bodies, strict=True):
            due = request.arrival_s / wall_speed
            delay = due - (loop.time() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            rec = RequestRecord(
                index=request.index,
                scheduled_s=due,
                sent_prompt_tokens=request.prompt_tokens,
                max_tokens=request.output_tokens,
            )
            records.append(rec)
            tasks.append(asyncio.create_task(one(body, rec)))
        await asyncio.gather(*tasks)
    return records, started_at


def scaled(records: Sequence[RequestRecord], factor: float) -> list[RequestRecord]:
    """Copies of `records` with every time multiplied by `factor` (wall -> simulated s)."""
    out = []
    for r in records:
        copy = RequestRecord(**{f: getattr(r, f) for f in RequestRecord.__slots__})
        for name in ("scheduled_s", "send_s", "first_token_s", "last_token_s", "end_s"):
            value = getattr(copy, name)
            if value is not None:
                setattr(copy, name, value * factor)
        out.append(copy)
    return out


# ============================================================================ processes


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Fleet:
    """The simulated workers: their processes and gRPC URLs (sidecar on port + 1)."""

    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    async def start(self, args: argparse.Namespace) -> None:
        """Start `args.workers` workers over `args.sim_procs` processes; wait for ready."""
        per = [args.workers // args.sim_procs] * args.sim_procs
        for i in range(args.workers % args.sim_procs):
            per[i] += 1
        for n in per:
            proc, ready = await spawn_sim(
                [
                    "--workers", str(n), "--port", "0", "--model", args.model, "--gpu", args.gpu,
                    "--tp", str(args.tp), "--speedup", str(args.speedup),
                    "--stream-interval", str(args.stream_interval),
                ],
                stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            self.procs.append(proc)
            self.urls.extend(w["url"] for w in ready["workers"])

    async def flush(self) -> None:
        """FlushCache on every worker once it is idle (after the previous run drained)."""
        from homing.engines.client import EngineClient

        for url in self.urls:
            client = EngineClient(url, worker_id=url)
            try:
                for _ in range(60):
                    if await client.flush_cache(timeout_s=30.0):
                        break
                    await asyncio.sleep(1.0)
                else:
                    raise RuntimeError(f"{url} did not flush its cache")
            finally:
                await client.close()

    async def sim_stats(self) -> dict[str, float]:
        """Sidecar counters summed over the workers: modelled wall seconds and slip (wall
        seconds of simulated progress lost because a sim fell behind), first tokens and the
        sum of their times to first token at the engine (simulated s), by sample name."""
        totals: Counter[str] = Counter()
        names = (
            "homing_sim_modeled_wall_seconds_total",
            "homing_sim_slip_wall_seconds_total",
            "homing_sim_first_tokens_total",
            "homing_sim_time_to_first_token_seconds_total",
        )
        async with aiohttp.ClientSession() as session:
            for url in self.urls:
                port = int(url.rsplit(":", 1)[1]) + 1
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = await resp.text()
                for name in names:
                    totals[name] += scrape_total(text, name)
        return dict(totals)

    async def stop(self) -> None:
        """SIGTERM every sim process, SIGKILL after 10 s."""
        await terminate(self.procs, grace_s=10)


async def _wait_http(
    url: str, ok: Any, timeout_s: float, proc: asyncio.subprocess.Process | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc is not None and proc.returncode is not None:
                raise RuntimeError(f"{url}: the gateway exited with {proc.returncode}")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200 and ok(await resp.text()):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"{url} not ready within {timeout_s} s")


async def _wait_smg_generates(
    target: Target, timeout_s: float, proc: asyncio.subprocess.Process
) -> None:
    """Until smg answers a one-token /generate (it lists its model before its tokenizer is
    registered, and answers 503 "tokenizer_not_ready" until then). The prompt is shorter
    than a page, so no engine caches it. RuntimeError past `timeout_s` or when smg exits."""
    body = json.dumps(
        {"model": target.model, "input_ids": [1], "stream": False,
         "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    status = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"smg exited with {proc.returncode} before it served")
            try:
                async with session.post(
                    target.url + "/generate",
                    data=body,
                    headers={"content-type": "application/json"},
                ) as resp:
                    status = resp.status
                    await resp.read()
                    if status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"smg answered no /generate within {timeout_s} s (last status {status})")


async def start_gateway(
    name: str, urls: Sequence[str], args: argparse.Namespace, log_path: Path, state_dir: Path
) -> tuple[asyncio.subprocess.Process, Target]:
    """Start homing (policy `name`; its admin socket and state in `state_dir`) or smg
    (`name` "smg": its cache_aware; "smg_<policy>": that policy) over `urls`; wait until it
    serves."""
    port = free_port()
    log = log_path.open("wb")
    if is_smg(name):
        argv = [
            str(Path(sys.executable).with_name("smg")), "launch", "--host", "127.0.0.1",
            "--port", str(port), "--worker-urls", *urls, "--policy", smg_policy(name),
            "--block-size", str(BLOCK), "--log-level", "warn",
        ]  # fmt: skip
        target = Target(f"http://127.0.0.1:{port}", "generate", "x-smg-routed-worker-id", "")
    else:
        policy, config = homing_run(name)
        argv = [
            sys.executable, "-m", "homing", "serve", "--port", str(port),
            "--grpc-port", str(free_port()), "--policy", policy, "--log-level", "info",
        ]  # fmt: skip
        if config is not None:
            argv += ["--config", str(config)]
        for url in urls:
            argv += ["--worker", url]
        target = Target(f"http://127.0.0.1:{port}", "openai", "x-homing-worker", "")
    # its own admin socket and state: another homing (a second bench) may run beside it
    env = {**os.environ, "HOMING_STATE_DIR": str(state_dir)}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, env=env
    )
    await _wait_http(target.url + "/v1/models", lambda text: '"id"' in text, 180, proc)
    async with aiohttp.ClientSession() as session:
        async with session.get(target.url + "/v1/models") as resp:
            target.model = (await resp.json())["data"][0]["id"]
    if not is_smg(name):
        await _wait_http(target.url + "/ready", lambda text: True, 60)
    else:
        await _wait_smg_generates(target, 60.0, proc)
    return proc, target


def is_smg(name: str) -> bool:
    """Whether run `name` is smg's ("smg" or "smg_<policy>")."""
    return name == "smg" or name.startswith("smg_")


def smg_policy(name: str) -> str:
    """smg's `--policy` for run `name`."""
    return "cache_aware" if name == "smg" else name.removeprefix("smg_")


def homing_run(name: str) -> tuple[str, Path | None]:
    """Run `name` of homing as (its `--policy`, its `--config` file or None): "POLICY" or
    "POLICY@FILE" (a TOML file of homing's config, e.g. `[router]` weights to compare)."""
    policy, _, config = name.partition("@")
    return policy, Path(config) if config else None


def run_slug(name: str) -> str:
    """Run `name` as a file-name stem: "POLICY@dir/a6.toml" -> "POLICY@a6"."""
    policy, config = homing_run(name)
    return policy if config is None else f"{policy}@{config.stem}"


def run_label(name: str) -> str:
    """Run `name` as the table names it: "smg cache_aware", "homing round_robin",
    "homing cache_aware@a6", ..."""
    return f"smg {smg_policy(name)}" if is_smg(name) else f"homing {run_slug(name)}"


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    await terminate([proc], grace_s=30)


async def homing_branches(target: Target) -> dict[str, float]:
    """Decisions by branch from homing's /metrics."""
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        async with session.get(target.url + "/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith("homing_router_decisions_total{"):
                    branch = line.split('branch="', 1)[1].split('"', 1)[0]
                    out[branch] = out.get(branch, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


# ============================================================================ the evaluation


def run_summary(
    name: str,
    records: Sequence[RequestRecord],
    args: argparse.Namespace,
    bound: float,
    worker_ids: Sequence[str],
) -> dict[str, Any]:
    """The run's row: the keys issue 4 names plus detail."""
    sim = scaled(records, args.speedup)
    summary = summarize(sim, slo=Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms))
    per_worker = Counter(r.worker for r in records if r.worker is not None)
    counts = [per_worker.get(w, 0) for w in worker_ids]
    mean = sum(counts) / len(counts) if counts else 0.0
    hit = summary["cache_hit_rate"] or 0.0
    return {
        "policy": name,
        "hit_rate": round(hit, 4),
        "bound_fraction": round(hit / bound, 4) if bound else None,
        "ttft_p50_ms": summary["ttft_ms"]["p50"],
        "ttft_p95_ms": summary["ttft_ms"]["p95"],
        "tpot_p95_ms": summary["tpot_ms"]["p95"],
        "goodput_rps": summary["goodput_rps"],
        "max_mean_load": round(max(counts) / mean, 3) if mean else None,
        "errors": summary["errors"],
        "requests": summary["requests"],
        "slo_attainment": summary["slo_attainment"],
        "ttft_p99_ms": summary["ttft_ms"]["p99"],
        "ttft_mean_ms": summary["ttft_ms"]["mean"],
        "tpot_p50_ms": summary["tpot_ms"]["p50"],
        "duration_sim_s": summary["duration_s"],
        "requests_per_worker": dict(zip(worker_ids, counts, strict=True)),
        "errors_by_kind": summary["errors_by_kind"],
        "error_samples": summary["error_samples"][:3],
    }


def format_table(rows: Sequence[dict[str, Any]], bound: float) -> str:
    """The markdown table of the runs."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:,.0f}"

    lines = [
        f"| router | hit rate | of bound ({100 * bound:.1f}%) | TTFT p50 ms | TTFT p95 ms | "
        "TPOT p95 ms | goodput req/s | max/mean per worker | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = run_label(r["policy"])
        lines.append(
            f"| {name} | {pct(r['hit_rate'])} | {pct(r['bound_fraction'])} | "
            f"{ms(r['ttft_p50_ms'])} | {ms(r['ttft_p95_ms'])} | {ms(r['tpot_p95_ms'])} | "
            f"{r['goodput_rps'] or 0:.3f} | {r['max_mean_load']} | {r['errors']} |"
        )
    return "\n".join(lines)


def load_requests(trace: str, limit: int | None) -> list[TraceRequest]:
    """`--trace`'s first `limit` requests: a trace file (`traces.load_trace`), or the
    synthetic multi-tenant chat trace for "chat[:key=value,...]" (`homing.bench.chat_trace`)."""
    if is_chat_spec(trace):
        return chat_requests(trace, limit)
    return load_trace(trace, limit=limit)


async def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """The whole evaluation (module docstring); returns the JSON document."""
    requests = load_requests(args.trace, args.limit)
    builder = PromptBuilder()
    timing = TimingModel.from_names(args.model, args.gpu, args.tp)
    limits = resolve_limits(timing, page_size=BLOCK)
    capacity_blocks = limits.kv_capacity_tokens // BLOCK
    total_prompt = sum(r.prompt_tokens for r in requests)
    t0 = time.monotonic()
    bound_hits = lru_hits(requests, builder, capacity_blocks * args.workers)
    bound = sum(bound_hits) / total_prompt
    rr_hits = lru_hits(requests, builder, capacity_blocks, caches=args.workers)
    rr_offline = sum(rr_hits) / total_prompt
    load_at_1 = offered_load(requests, rr_hits, timing, args.workers, 1.0)
    speed = args.speed or args.target_load / load_at_1
    print(
        f"offline ({time.monotonic() - t0:.0f} s): LRU bound {100 * bound:.1f}% "
        f"(one cache of {capacity_blocks * args.workers * BLOCK:,} tokens); round robin "
        f"offline {100 * rr_offline:.1f}%; offered load {load_at_1:.3f} at speed 1 -> speed "
        f"{speed:.3f} for {args.target_load:.2f}",
        flush=True,
    )
    out_dir = Path(args.json).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet()
    await fleet.start(args)
    worker_ids = [f"w{i}" for i in range(len(fleet.urls))]
    url_to_id = dict(zip(fleet.urls, worker_ids, strict=True))
    rows: list[dict[str, Any]] = []
    plotted: dict[str, list[RequestRecord]] = {}
    states = Path(tempfile.mkdtemp(prefix="homing-bench-"))
    try:
        for i, name in enumerate(args.runs):
            await fleet.flush()
            trace = KvTrace(dict(zip(worker_ids, fleet.urls, strict=True)))
            if args.affinity:
                await trace.start()
            log_path = out_dir / f"{run_slug(name)}.log"
            proc, target = await start_gateway(name, fleet.urls, args, log_path, states / str(i))
            before = await fleet.sim_stats()  # after smg's readiness request, if any
            started = time.monotonic()
            try:
                records, sent_at = await replay(
                    target, requests, builder, speed * args.speedup, args.timeout_s
                )
                branches = {} if is_smg(name) else await homing_branches(target)
            finally:
                await stop_process(proc)
                changes = await trace.stop()
            for r in records:
                if r.worker is not None:
                    r.worker = url_to_id.get(r.worker, r.worker)
            affinity = None
            if args.affinity:
                affinity = affinity_of(name, records, requests, builder, changes, sent_at, log_path)
                affinity["kv_stream_errors"] = trace.errors
                affinity["kv_batches_missed"] = trace.gaps
            after = await fleet.sim_stats()
            if args.dump_records:
                dump = out_dir / f"records-{run_slug(name)}.jsonl"
                with dump.open("w", encoding="utf-8") as f:
                    for r in records:
                        f.write(json.dumps({k: getattr(r, k) for k in RequestRecord.__slots__}))
                        f.write("\n")
            row = run_summary(name, records, args, bound, worker_ids)
            if args.plot:
                plotted[run_label(name)] = scaled(records, args.speedup)
            row["wall_s"] = round(time.monotonic() - started, 1)
            row["branches"] = branches
            if affinity is not None:
                row["affinity"] = affinity
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            row["sim_slip_wall_s"] = round(delta["homing_sim_slip_wall_seconds_total"], 2)
            row["sim_modeled_wall_s"] = round(delta["homing_sim_modeled_wall_seconds_total"], 2)
            firsts = delta["homing_sim_first_tokens_total"]
            row["engine_ttft_mean_ms"] = (
                round(1000 * delta["homing_sim_time_to_first_token_seconds_total"] / firsts, 1)
                if firsts
                else None
            )
            rows.append(row)
            print(
                f"{run_slug(name):>16}: hit {100 * row['hit_rate']:.1f}%  TTFT p50/p95 "
                f"{row['ttft_p50_ms']}/{row['ttft_p95_ms']} ms  TPOT p95 {row['tpot_p95_ms']} ms  "
                f"goodput {row['goodput_rps']}  max/mean {row['max_mean_load']}  errors "
                f"{row['errors']}  ({row['wall_s']} s wall, sim slip "
                f"{row['sim_slip_wall_s']} s)  TTFT mean {row['ttft_mean_ms']} ms, at the "
                f"engines {row['engine_ttft_mean_ms']} ms",
                flush=True,
            )
            if affinity is not None:
                print(affinity["table_markdown"], flush=True)
                if trace.errors or trace.gaps:
                    print(
                        f"KV streams incomplete (the judged caches miss events): errors "
                        f"{trace.errors}, batches missed {trace.gaps}",
                        flush=True,
                    )
    finally:
        await fleet.stop()
        shutil.rmtree(states, ignore_errors=True)
    table = format_table(rows, bound)
    print(table, flush=True)
    if plotted:
        from homing.bench.plots import write_comparison_plots  # matplotlib only when asked for

        slo = Slo(ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)
        title = f"bench-routers, {len(requests):,} requests (simulated time)"
        for path in write_comparison_plots(plotted, args.plot, slo, title=title):
            print(f"wrote {path}", file=sys.stderr)
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m homing.bench.routers", *sys.argv[1:]]),
        "trace": args.trace,
        "requests": len(requests),
        "workers": args.workers,
        "model": args.model,
        "gpu": args.gpu,
        "tp": args.tp,
        "kv_capacity_tokens_per_worker": limits.kv_capacity_tokens,
        "speed": round(speed, 4),
        "speedup": args.speedup,
        "wall_speed": round(speed * args.speedup, 4),
        "stream_interval": args.stream_interval,
        "offered_load_round_robin": round(load_at_1 * speed, 4),
        "bound": round(bound, 4),
        "round_robin_offline_hit_rate": round(rr_offline, 4),
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms},
        "runs": rows,
        "table_markdown": table,
    }


def affinity_of(
    name: str,
    records: Sequence[RequestRecord],
    requests: Sequence[TraceRequest],
    builder: PromptBuilder,
    changes: Sequence[CacheChange],
    sent_at: float,
    log_path: Path,
) -> dict[str, Any]:
    """The run's `homing.bench.affinity` summary as a JSON object (with its markdown):
    homing's decisions from its log's `route` objects, smg's at the client's send time."""
    prompts = {r.index: builder.prompt_ids(r) for r in requests}
    routes = None
    if not is_smg(name):
        with log_path.open(encoding="utf-8", errors="replace") as f:
            routes = homing_routes(f)
    routed = routed_requests(records, prompts, sent_at=sent_at, block_size=BLOCK, routes=routes)
    _, summary = judge(routed, changes, BLOCK)
    label = run_label(name)
    return {
        "requests": len(routed),
        "kv_events": len(changes),
        "prompt_tokens": summary.prompt_tokens,
        "best_tokens": summary.best,
        "held_tokens": summary.held,
        "served_tokens": summary.served,
        "evicted_tokens": summary.evicted,
        "categories": {c: {"requests": n, "lost_tokens": lost} for c, n, lost, _ in summary.rows()},
        "table_markdown": markdown(summary, label),
    }


def build_parser() -> argparse.ArgumentParser:
    """Options of `python -m homing.bench.routers`."""
    p = argparse.ArgumentParser(prog="homing.bench.routers", description=__doc__.splitlines()[0])
    p.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help="a Mooncake .jsonl / Azure .csv file, or 'chat[:key=value,...]' for the synthetic "
        "multi-tenant chat trace (homing.bench.chat_trace; keys are ChatConfig's fields)",
    )
    p.add_argument("--limit", type=int, default=2000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sim-procs", type=int, default=2, help="processes hosting the workers")
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--gpu", default="H100")
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--speedup", type=float, default=2.0, help="sim time per wall second")
    p.add_argument("--speed", type=float, default=0.0, help="trace speed (0: --target-load)")
    p.add_argument("--target-load", type=float, default=0.70)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument(
        "--affinity",
        action="store_true",
        help="follow the workers' KV events and judge each decision against them "
        "(homing.bench.affinity)",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=50.0)
    p.add_argument("--timeout-s", type=float, default=900.0)
    p.add_argument(
        "--runs",
        nargs="+",
        default=[*HOMING_POLICIES, "smg"],
        help='runs in order: a homing policy, "POLICY@CONFIG.toml" (homing with that config), '
        '"smg" (its cache_aware) or "smg_POLICY"',
    )
    p.add_argument("--json", default="bench-out/routers.json")
    p.add_argument(
        "--dump-records", action="store_true", help="also write records-<run>.jsonl per run"
    )
    p.add_argument(
        "--plot", default=None, metavar="DIR", help="write the runs' PNGs side by side into DIR"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; writes `--json`."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    import uvloop

    result = uvloop.run(evaluate(args))
    out = Path(args.json)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
