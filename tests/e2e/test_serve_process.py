"""`homing serve` as a user runs it: a real process with simulated child workers, streaming
chat over HTTP, and a clean SIGTERM shutdown that takes the children with it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


@pytest.mark.timeout(90)
def test_serve_streams_chat_and_stops_cleanly_on_sigterm() -> None:
    """`homing serve` becomes ready, streams SSE ending in [DONE], and exits 0 on SIGTERM
    with its simulated workers gone."""
    http, grpc_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "homing",
            "serve",
            "--port",
            str(http),
            "--grpc-port",
            str(grpc_port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while _get(f"http://127.0.0.1:{http}/ready")[0] != 200:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "not ready within 60 s"
            time.sleep(0.2)
        children = _children(proc.pid)
        assert len(children) == 2
        model = json.loads(_get(f"http://127.0.0.1:{http}/v1/models")[1])["data"][0]["id"]
        body = json.dumps(
            {
                "model": model,
                "stream": True,
                "messages": [{"role": "user", "content": "Say hello in Chinese"}],
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{http}/v1/chat/completions",
            data=body,
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
            assert resp.headers["x-homing-worker"]
        events = [e for e in text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert len(events) > 3
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0
    time.sleep(0.5)
    assert all(not os.path.exists(f"/proc/{c}") or _is_zombie(c) for c in children)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")
    except OSError:
        return True
