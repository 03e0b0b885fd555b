"""Signals to a real `homing serve` process group, as a terminal sends them to a shell job:
SIGHUP reloads the configuration and stops nothing; SIGINT (Ctrl-C) and SIGTERM let 20
open streams run to their end before the process exits 0, its simulated workers serving
until then."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

pytestmark = pytest.mark.asyncio

STREAMS = 20
MAX_TOKENS = 400


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A running `homing serve` child and its HTTP port."""

    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.port = port
        self.log: list[str] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def signal_group(self, signum: int) -> None:
        """Send `signum` to the whole process group, as a terminal does."""
        os.killpg(self.process.pid, signum)

    async def read_log(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.log.append(line.decode(errors="replace"))


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    """`homing serve` on free ports over its two simulated workers, ready."""
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "homing",
        "serve",
        "--port",
        str(port),
        "--grpc-port",
        str(_free_port()),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # its own process group, as a shell job is
    )
    server = Served(process, port)
    reader = asyncio.ensure_future(server.read_log())
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                assert process.returncode is None, "".join(server.log)
                try:
                    async with http.get(server.url("/ready")) as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            else:
                pytest.fail("not ready within 60 s:\n" + "".join(server.log))
        yield server
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        reader.cancel()


async def _refuses_connections(served: Served) -> bool:
    """Whether a new connection to the HTTP port is refused within 5 s."""
    for _ in range(250):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", served.port)
        except OSError:
            return True
        writer.close()
        await asyncio.sleep(0.02)
    return False


@pytest.mark.timeout(120)
async def test_sighup_to_the_group_reloads_and_stops_nothing(served: Served) -> None:
    """After SIGHUP to its group (a terminal hanging up) the process has reloaded its
    (unchanged) configuration and still serves completions, its workers too."""
    served.signal_group(signal.SIGHUP)
    async with aiohttp.ClientSession() as http:
        for _ in range(100):
            if any("reload_applied" in line for line in served.log):
                break
            await asyncio.sleep(0.05)
        assert any("reload_applied" in line for line in served.log), "".join(served.log)
        body = {"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 4}
        async with http.post(served.url("/v1/completions"), json=body) as resp:
            assert resp.status == 200
        async with http.get(served.url("/ready")) as resp:
            assert resp.status == 200
    assert served.process.returncode is None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_stop_signal_lets_twenty_open_streams_finish(served: Served, signum: int) -> None:
    """SIGTERM or SIGINT to the group with 20 streams open: each runs to `max_tokens` and
    `[DONE]`, a new connection is refused, and the process exits 0."""
    body = {
        "model": "llama-3.1-8b",
        "prompt": "Tell a long story",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as http:
        responses = [
            await http.post(served.url("/v1/completions"), json=body) for _ in range(STREAMS)
        ]
        for resp in responses:  # every stream is under way before the signal
            assert resp.status == 200
            await resp.content.readline()
        served.signal_group(signum)
        reading = asyncio.gather(*(resp.read() for resp in responses))
        assert await _refuses_connections(served), "the listener stayed open"
        assert not reading.done()  # refused while the streams were still running
        texts = await reading
    for raw in texts:
        events = [e for e in raw.decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        chunks = [
            json.loads(e.removeprefix("data: ")) for e in events[:-1] if e.startswith("data: {")
        ]
        assert not any("error" in c for c in chunks)
        assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert await asyncio.wait_for(served.process.wait(), 60) == 0
