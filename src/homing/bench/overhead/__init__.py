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
  1, so 64 and 256 chunks from the worker: every homing target without a config of its own
  runs with one saying `[engines] stream_interval = 1`, since the default "auto" would
  coarsen chunks under this load) and the slope (cpu256 - cpu64) / 192;
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

More targets, each in the same interleaved rounds (every phase's order of targets
rotating by one each round):

- "homing_before" (`--homing-before-src DIR`, the `src` directory of an older homing
  checkout with its native modules and generated stubs built): the same `homing serve`
  command with `PYTHONPATH=DIR`, so that gateway runs the old code over the same workers;
  every figure homing has, and the ratio after/before (homing / homing_before);
- "homing_nometrics": the same `homing serve` with `[obs] request_metrics = false` (a TOML
  file in the scratch directory): no per-request Prometheus series (the log line, SLO
  bookkeeping and worker snapshots stay); every HTTP figure homing has, and the ratio
  metrics on/off (homing / homing_nometrics);
- "homing_p2": the same `homing serve` with `--processes 2`, its CPU that of both gateway
  processes; every HTTP figure homing has, and the ratio 2 processes / 1;
- "homing_si2", "homing_si4", "homing_si8": the same `homing serve` with `[engines]
  stream_interval` 2, 4 or 8 (a TOML file in the scratch directory; the command-line flags
  override the rest of it): only the streamed CPU per token and the streamed first byte, set
  beside homing's and smg's at stream_interval 1;
- "grpc_aio": no gateway, the floor under any Python gateway: a child process (this package,
  `python -m homing.bench.overhead _grpc-floor`) with one `grpc.aio` channel (homing's
  `DEFAULT_CHANNEL_OPTIONS`) to the first worker, under uvloop, running each CPU phase as the
  same engine calls (`build_generate_request`, 16 prompt tokens, temperature 0, ignore_eos,
  every message read): its own process CPU clock (all threads) per call, and per streamed
  message as the slope (cpu256 - cpu64) / (messages256 - messages64).

`--targets` picks some of them (DIRECT, the first-byte baseline, always runs).

Written: `--json` (every round's raw figures, the medians, the ratios, command, date,
machine) and a table on stdout: metric, homing, smg, homing/smg, homing_before,
after/before, homing without request metrics, metrics on/off, homing with 2 processes, 2
processes / 1, homing's gRPC API, grpc.aio client alone; then the rows of the fixed stream
intervals.

    python -m homing.bench.overhead --rounds 3 --json bench-out/overhead.json

Modules, one per job: `cli` (the options, the table and `--json` written), `runner` (one
run: start, warm up, the rounds, stop, the result), `stack` (the processes and this one's
clients to them), `client` (one request to one target), `floor` (the grpc.aio floor's child
and its parent's end), `phases` (the load of each phase and the CPU clocks around it),
`procfs` (CPU clocks, /proc and the machine), `report` (medians, ratios and the table; pure),
`targets` (the targets' names) and `workload` (what every request sends, what a good answer
is). `python -m homing.bench.overhead` runs `cli.main`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from homing.bench.overhead.report import print_table, summarize
from homing.bench.overhead.targets import (
    DIRECT,
    GATEWAYS,
    GRPC_FLOOR,
    HOMING,
    HOMING_BEFORE,
    HOMING_GRPC,
    HOMING_NOMETRICS,
    HOMING_P2,
    HOMING_SI2,
    HOMING_SI4,
    HOMING_SI8,
    SMG,
    STREAM_INTERVALS,
    STREAMED_ONLY,
    TARGETS,
)

if TYPE_CHECKING:
    from homing.bench.overhead.cli import build_parser, main
    from homing.bench.overhead.runner import run

_LAZY = {"build_parser": "cli", "main": "cli", "run": "runner"}
"""Names re-exported from the I/O modules, imported on first use: importing the package (and
so its pure `report` and `targets`) starts no asyncio, grpc or subprocess import."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DIRECT",
    "GATEWAYS",
    "GRPC_FLOOR",
    "HOMING",
    "HOMING_BEFORE",
    "HOMING_GRPC",
    "HOMING_NOMETRICS",
    "HOMING_P2",
    "HOMING_SI2",
    "HOMING_SI4",
    "HOMING_SI8",
    "SMG",
    "STREAMED_ONLY",
    "STREAM_INTERVALS",
    "TARGETS",
    "build_parser",
    "main",
    "print_table",
    "run",
    "summarize",
]
