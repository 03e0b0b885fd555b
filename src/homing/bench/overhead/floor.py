"""The grpc.aio floor of `make bench-overhead`: a child process (`python -m
homing.bench.overhead _grpc-floor`) with one grpc.aio channel to a worker, running each CPU
phase as the same engine calls with no gateway around them and timing them on its own CPU
clock; and `FloorClient`, the parent's end of its stdin/stdout pipe.

Rule of this file: both ends of the floor; the parent's phase around it is `phases`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import uvloop
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as sgl_grpc

from homing.bench.overhead.workload import READY_TIMEOUT_S, REQUEST_TIMEOUT_S, check_usage
from homing.engines.client import DEFAULT_CHANNEL_OPTIONS, GenerateParams, build_generate_request
from homing.sim.process import terminate

FLOOR_COMMAND = "_grpc-floor"
"""The hidden first argument that makes `python -m homing.bench.overhead` the grpc.aio
floor's child process."""


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
        return messages, check_usage(last.complete.completion_tokens, max_tokens)

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
