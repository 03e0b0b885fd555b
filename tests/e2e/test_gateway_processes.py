"""`homing serve` with `gateway.processes = 2` as a user runs it: a real leader process with
its simulated workers and a real follower process, both serving the same HTTP and gRPC
ports, one admin API whose drains reach both, reloads and the stop passed on, a killed
follower started again, one tenant's quota across both, and 30 open streams through a
reload, a drain and a killed follower."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from helpers import NotifyListener

from homing.admin.client import AdminClient, AdminError
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

CONFIG = """
[gateway]
port = 0
grpc_port = 0
processes = 2
drain_timeout_s = 60.0  # a loaded machine slows the streams; the drain waits for them
[sim]
workers = 2
speedup = 10.0
[daemon]
status_interval_s = 600
[admin]
state_dir = "{state}"
"""

MODEL = "llama-3.1-8b"


@dataclass
class Served:
    """The leader's process, its log, its ports and the admin addresses of both."""

    process: subprocess.Popen[bytes]
    log: Path
    notify: NotifyListener
    http: int
    grpc: int
    leader_admin: str
    follower_admin: str

    def events(self, name: str) -> list[dict[str, object]]:
        """The log lines of event `name`, parsed."""
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{") and f'"event": "{name}"' in line:
                out.append(json.loads(line))
        return out

    def follower_pids(self) -> list[int]:
        """Live processes started as this leader's followers."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if b"--follower" in argv and int(stat[1]) == self.process.pid and stat[0] != b"Z":
                found.append(int(entry.name))
        return found


def _start(tmp_path: Path, extra: str = "") -> Iterator[Served]:
    """A leader and its follower serving `CONFIG` plus `extra`, both ready (the leader's
    READY=1 waits for the follower's)."""
    state = tmp_path / "state"
    config = tmp_path / "homing.toml"
    config.write_text(CONFIG.format(state=state) + extra)
    log = tmp_path / "serve.log"
    notify = NotifyListener(tmp_path / "notify.sock")
    process = subprocess.Popen(
        [sys.executable, "-m", "homing", "serve", "--config", str(config)],
        env={**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1"},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        notify.until("READY", 60)
        serving = next(e for e in _events(log, "serving") if e.get("process") == 0)
        # the state directory's "processes", or a shorter one where sockets would not fit
        (runtime,) = (e["path"] for e in _events(log, "gateway_processes_runtime"))
        yield Served(
            process=process,
            log=log,
            notify=notify,
            http=int(str(serving["http"]).rsplit(":", 1)[1]),
            grpc=int(str(serving["grpc"]).rsplit(":", 1)[1]),
            leader_admin=f"unix:{state}/admin.sock",
            follower_admin=f"unix:{runtime}/process-1/admin.sock",
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        notify.sock.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """Two processes over two simulated workers, no tenants."""
    yield from _start(tmp_path)


KEY = "sk-processes-test"
TENANT = f"""
[[tenants]]
name = "acme"
quota = {{ requests_per_minute = 10 }}
[[tenants.keys]]
id = "acme-1"
sha256 = "{hashlib.sha256(KEY.encode()).hexdigest()}"
"""


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Served]:
    """Two processes, one tenant at 10 requests per minute on the memory backend."""
    yield from _start(tmp_path, TENANT)


def _events(log: Path, name: str) -> list[dict[str, object]]:
    return [
        json.loads(line)
        for line in log.read_text().splitlines()
        if line.startswith("{") and f'"event": "{name}"' in line
    ]


def _complete(port: int) -> int:
    """One completion over a new HTTP connection; its status."""
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"content-type": "application/json", "connection": "close"},
    )
    with urllib.request.urlopen(request, timeout=20) as resp:
        return resp.status


def _only_the_follower_serves_http(s: Served) -> None:
    """With the leader stopped (SIGSTOP), it accepts nothing: a completion that is answered
    was the follower's."""
    s.process.send_signal(signal.SIGSTOP)
    try:
        assert _complete(s.http) == 200
    finally:
        s.process.send_signal(signal.SIGCONT)


async def _in_flight(address: str) -> int:
    async with AdminClient(address) as admin:
        return (await admin.get_stats()).in_flight


async def _workers_in_flight(address: str) -> int:
    """The requests in flight on every worker, as `homing workers ls` there shows them."""
    async with AdminClient(address) as admin:
        return sum(w.in_flight for w in (await admin.list_workers()).workers)


async def _grpc_streams_reach_both(s: Served, streams: int = 16) -> tuple[int, int, int]:
    """`streams` long gRPC streams, each on its own connection (the kernel spreads the
    connections over both processes' SO_REUSEPORT sockets by their addresses); returns the
    requests in flight as the leader's and the follower's `homing stats` show them once all
    are open, and those on the workers as the leader's `homing workers ls` shows them."""
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{s.grpc}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(streams)
    ]
    calls = []
    try:
        for channel in channels:
            request = pb.ChatCompletionRequest(
                model=MODEL,
                messages=[pb.ChatMessage(role="user", content="tell me a story")],
                stream=True,
                sampling=pb.SamplingOptions(max_tokens=4000, ignore_eos=True),
            )
            call = pb_grpc.InferenceStub(channel).ChatCompletion(request)
            await call.read()  # the first answer: the stream is open on a worker
            calls.append(call)
        leader, follower = await _in_flight(s.leader_admin), await _in_flight(s.follower_admin)
        return leader, follower, await _workers_in_flight(s.leader_admin)
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()


async def _rollout_refusal(s: Served) -> tuple[grpc.StatusCode, str]:
    """Starting a rollout on the leader: refused, its code and message."""
    async with AdminClient(s.leader_admin) as admin:
        with pytest.raises(AdminError) as err:
            await admin.start_rollout(MODEL, "v2", None, None)
    return err.value.code, err.value.message


async def _until_drained_in_follower(s: Served) -> tuple[str, str]:
    """Drain w1 on the leader; its url and its phase in the follower once it is no longer
    ready there (at most 10 s)."""
    async with AdminClient(s.leader_admin) as admin:
        drained = await admin.drain_worker("w1")
    url = drained.worker.url
    async with AdminClient(s.follower_admin) as admin:
        async with asyncio.timeout(10):
            while True:
                workers = {w.url: w.phase for w in (await admin.list_workers()).workers}
                if workers.get(url, "gone") != "ready":
                    return url, workers.get(url, "gone")
                await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
def test_two_processes_serve_one_port_pair_follow_one_admin_api_and_stop_together(
    served: Served,
) -> None:
    """The follower answers HTTP on the leader's port while the leader is stopped;
    /metrics has both processes' series whichever answers; 16 gRPC connections land on
    both processes, and both processes' `homing stats` and the leader's `homing workers ls`
    count all 16 in flight (the shared in-flight board); a rollout is refused (the
    followers would not follow its split); a drain on the leader's admin API drains the
    worker in the follower; SIGHUP reloads both; SIGTERM stops both, exit 0."""
    s = served
    (follower,) = s.follower_pids()
    _only_the_follower_serves_http(s)
    for _ in range(4):  # whichever process a scrape reaches, it answers for both
        with urllib.request.urlopen(f"http://127.0.0.1:{s.http}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert "homing_gateway_processes_scraped 2.0" in text
        assert 'homing_event_loop_busy_ratio{process="0"}' in text
        assert 'homing_event_loop_busy_ratio{process="1"}' in text
    leader_stats, follower_stats, on_workers = asyncio.run(_grpc_streams_reach_both(s))
    # each admin API counts every process's requests (the shared in-flight board)
    assert (leader_stats, follower_stats, on_workers) == (16, 16, 16)
    deadline = time.monotonic() + 10
    while len(s.events("request_done")) < 17 and time.monotonic() < deadline:
        time.sleep(0.1)  # the 16 streams, cancelled, and the HTTP completion
    served_by = [e["process"] for e in s.events("request_done")]
    assert sorted(set(served_by)) == [0, 1], served_by  # 2 in 2**16 to fail by chance
    code, message = asyncio.run(_rollout_refusal(s))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert message == (
        "rollouts and version splits change one process's routing only: run them with "
        "gateway.processes = 1 (the other processes do not follow them yet)"
    )
    url, phase = asyncio.run(_until_drained_in_follower(s))
    assert phase in ("draining", "gone"), (url, phase)
    assert [e["kind"] for e in s.events("mirror_action")] == ["drain"]
    s.process.send_signal(signal.SIGHUP)
    status = s.notify.until("READY", 45)["STATUS"]  # once the follower's reload is done too
    assert "reloaded: nothing changed" in status and "process 1" not in status, status
    assert sorted(e["process"] for e in s.events("reload_applied")) == [0, 1]
    s.process.send_signal(signal.SIGTERM)
    assert s.process.wait(30) == 0
    assert not Path(f"/proc/{follower}").exists()
    assert sorted(e["process"] for e in s.events("shutdown_requested")) == [0, 1]


@pytest.mark.timeout(120)
def test_a_killed_follower_is_started_again_and_serves(served: Served) -> None:
    """SIGKILL of the follower: the leader logs its exit and starts another within the
    first backoff (1 s), which serves the port again once ready."""
    s = served
    (first,) = s.follower_pids()
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = s.follower_pids()
        if pids and pids != [first] and len(s.events("ready")) >= 3:
            break
        time.sleep(0.1)
    (second,) = s.follower_pids()
    assert second != first
    (exited,) = s.events("gateway_process_exited")
    assert (exited["pid"], exited["code"], exited["restart_in_s"]) == (first, -9, 1.0)
    _only_the_follower_serves_http(s)
    assert s.process.poll() is None


async def _forty_calls(s: Served) -> list[grpc.StatusCode]:
    """40 short completions at once over gRPC, each on its own connection (so both
    processes get some), with the tenant's key; each call's status."""

    async def one(index: int) -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{s.grpc}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as channel:
            request = pb.ChatCompletionRequest(
                model=MODEL,
                messages=[pb.ChatMessage(role="user", content=f"call {index}")],
                sampling=pb.SamplingOptions(max_tokens=2),
            )
            call = pb_grpc.InferenceStub(channel).ChatCompletion(
                request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=30
            )
            try:
                _ = [answer async for answer in call]
            except grpc.aio.AioRpcError as err:
                return err.code()
            return grpc.StatusCode.OK

    return list(await asyncio.gather(*(one(i) for i in range(40))))


@pytest.mark.timeout(120)
def test_a_tenant_at_10_requests_a_minute_gets_exactly_10_of_40_across_processes(
    limited: Served,
) -> None:
    """The memory backend is the leader's: the follower charges it over the leader's quota
    socket, so 40 calls spread over both processes admit exactly 10; the rest are refused
    RESOURCE_EXHAUSTED, and both processes answered some."""
    codes = asyncio.run(_forty_calls(limited))
    assert codes.count(grpc.StatusCode.OK) == 10, codes
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 30, codes
    answered_by = {e.get("process") for e in limited.events("request_done")}
    assert answered_by == {0, 1}  # each got some of the 40: 2 in 2**40 to fail by chance


@dataclass
class StreamEnd:
    """How one SSE stream ended: `done` ([DONE] last), `error_event` (an error event before
    [DONE]), `tokens` (the completion tokens its usage chunk counts; None: no usage chunk),
    or `transport` (the connection broke: the error's type)."""

    done: bool = False
    error_event: bool = False
    tokens: int | None = None
    transport: str | None = None


async def _one_stream(
    port: int, index: int, opened: asyncio.Event, count: list[int], expected: int
) -> StreamEnd:
    """One stream; the `expected`-th to get its first event sets `opened`."""
    body = {
        "model": MODEL,
        "prompt": f"stream {index}",
        "max_tokens": STREAM_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    end = StreamEnd()
    try:
        async with aiohttp.ClientSession() as session:  # a connection of its own
            async with session.post(
                f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=_TIMEOUT
            ) as resp:
                assert resp.status == 200
                first = True
                async for line in resp.content:
                    text = line.decode().strip()
                    if not text.startswith("data: "):
                        continue
                    if first:
                        first = False
                        count[0] += 1
                        if count[0] == expected:
                            opened.set()
                    if text == "data: [DONE]":
                        end.done = True
                    elif '"error"' in text:
                        end.error_event = True
                    else:
                        usage = json.loads(text.removeprefix("data: ")).get("usage")
                        if usage:
                            end.tokens = usage["completion_tokens"]
    except (aiohttp.ClientError, ConnectionError) as err:
        end.transport = type(err).__name__
    return end


STREAMS = 30
STREAM_TOKENS = 3000  # about 3 s at 10x speed: open through the fault
_TIMEOUT = aiohttp.ClientTimeout(total=60)


async def _streams_through(port: int, fault: Callable[[], None]) -> list[StreamEnd]:
    """30 streams, each on its own connection; `fault()` once every one has its first
    event; how each ended (all end: none may hang past the 60 s client timeout)."""
    opened, count = asyncio.Event(), [0]
    tasks = [
        asyncio.create_task(_one_stream(port, i, opened, count, STREAMS)) for i in range(STREAMS)
    ]
    await asyncio.wait_for(opened.wait(), 30)
    fault()
    return list(await asyncio.gather(*tasks))


async def _streams_on_both(
    port: int, leader: subprocess.Popen[bytes], follower: int, fault: Callable[[], None]
) -> list[StreamEnd]:
    """`_streams_through`, half of the streams on each process: the first half opens while
    the leader is stopped (SIGSTOP: the follower accepts them all from the shared socket),
    the second while the follower is; each is continued (SIGCONT) once its half has opened,
    the follower just before `fault()`."""
    half, tasks = STREAMS // 2, []
    for paused, start in ((leader.pid, 0), (follower, half)):
        opened, count = asyncio.Event(), [0]
        os.kill(paused, signal.SIGSTOP)
        try:
            tasks += [
                asyncio.create_task(_one_stream(port, start + i, opened, count, half))
                for i in range(half)
            ]
            await asyncio.wait_for(opened.wait(), 30)
        finally:
            os.kill(paused, signal.SIGCONT)
    fault()
    return list(await asyncio.gather(*tasks))


def _finished(end: StreamEnd) -> bool:
    """Every token (by its usage) and [DONE], no error."""
    return end.done and not end.error_event and end.tokens == STREAM_TOKENS


@pytest.mark.timeout(120)
def test_30_streams_open_through_a_sighup_all_finish(served: Served) -> None:
    """A reload of both processes while 30 streams run cuts none of them."""
    hup = lambda: served.process.send_signal(signal.SIGHUP)  # noqa: E731
    ends = asyncio.run(_streams_through(served.http, hup))
    assert [e for e in ends if not _finished(e)] == []
    served.notify.until("READY", 30)  # the reload's own READY=1


@pytest.mark.timeout(120)
def test_30_streams_open_through_a_sigterm_all_finish_and_both_processes_exit(
    served: Served,
) -> None:
    """The 30 streams open on the follower (the leader is stopped, SIGSTOP, while they
    open), then the leader gets SIGTERM with none of its own: it drains at once but stops
    the workers it started only once the follower has drained (drain_timeout_s 60 s,
    streams ~3 s). All 30 finish; the leader exits 0 with its follower gone."""
    (follower,) = served.follower_pids()

    def stop() -> None:
        served.process.send_signal(signal.SIGCONT)
        served.process.send_signal(signal.SIGTERM)

    served.process.send_signal(signal.SIGSTOP)  # every stream opens on the follower
    try:
        ends = asyncio.run(_streams_through(served.http, stop))
    finally:
        served.process.send_signal(signal.SIGCONT)
    assert [e for e in ends if not _finished(e)] == []
    assert served.process.wait(60) == 0
    assert not Path(f"/proc/{follower}").exists()
    by = [e["process"] for e in served.events("request_done")]
    assert by == [1] * STREAMS  # all on the follower: the leader had none to wait for


@pytest.mark.timeout(120)
def test_30_streams_open_through_a_killed_follower_end_finished_or_broken_never_silent(
    served: Served,
) -> None:
    """SIGKILL of the follower with 30 streams open: the leader's streams all finish; the
    follower's connections are closed by the kernel with the process (nothing of it is left
    to write an error event), so each of its streams ends with a broken connection the
    client sees. No stream ends early looking complete, none hangs."""
    (follower,) = served.follower_pids()
    kill = lambda: os.kill(follower, signal.SIGKILL)  # noqa: E731
    ends = asyncio.run(_streams_on_both(served.http, served.process, follower, kill))
    finished = [e for e in ends if _finished(e)]
    broken = [e for e in ends if e.transport is not None and not e.done]
    print(f"{len(finished)} streams finished, {len(broken)} broken with the follower")
    assert len(finished) + len(broken) == STREAMS, ends
    assert len(finished) == len(broken) == STREAMS // 2  # 15 on each process
