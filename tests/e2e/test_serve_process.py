"""`homing serve` as a user runs it: a real process with simulated child workers, streaming
chat over HTTP, and a clean SIGTERM shutdown that takes the children with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import free_port, http_get


def _wait_ready(proc: subprocess.Popen[bytes], http: int) -> None:
    """Poll `/ready` until 200 (60 s at most); fail with its stderr if the process exits."""
    deadline = time.monotonic() + 60
    while http_get(f"http://127.0.0.1:{http}/ready")[0] != 200:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "not ready within 60 s"
        time.sleep(0.2)


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
    http, grpc_port = free_port(), free_port()
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
        _wait_ready(proc, http)
        children = _children(proc.pid)
        assert len(children) == 2
        model = json.loads(http_get(f"http://127.0.0.1:{http}/v1/models")[1])["data"][0]["id"]
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


@pytest.mark.timeout(90)
def test_serve_with_two_sim_models_serves_each_on_its_own_workers() -> None:
    """`homing serve --sim-model A=1 --sim-model B=2` lists both models and serves a
    request to each on a worker of that model (three children in all)."""
    http, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "homing", "serve", "--port", str(http)]
    command += ["--grpc-port", str(grpc_port), "--speedup", "10"]
    command += ["--sim-model", "llama-3.1-8b=1", "--sim-model", "llama-3.1-70b=2"]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        _wait_ready(proc, http)
        assert len(_children(proc.pid)) == 3
        ready = json.loads(http_get(f"http://127.0.0.1:{http}/ready")[1])
        listed = json.loads(http_get(f"http://127.0.0.1:{http}/v1/models")[1])["data"]
        workers = {}
        for model in ("llama-3.1-8b", "llama-3.1-70b"):
            body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{http}/v1/completions",
                data=body,
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert json.loads(resp.read())["model"] == model
                workers[model] = resp.headers["x-homing-worker"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0
    assert [m["id"] for m in listed] == ["llama-3.1-8b", "llama-3.1-70b"]
    assert ready["models"] == {
        "llama-3.1-8b": {"ready_workers": 1, "workers": 1},
        "llama-3.1-70b": {"ready_workers": 2, "workers": 2},
    }
    assert workers["llama-3.1-8b"] == "w0"  # ids in config order: w0 | w1, w2
    assert workers["llama-3.1-70b"] in ("w1", "w2")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("x=1", "unknown preset 'x'; known: llama-3.1-70b, llama-3.1-8b"),
        ("llama-3.1-8b=0", "'llama-3.1-8b=0': N must be 1 to 64 workers"),
        ("llama-3.1-8b=²", "'llama-3.1-8b=²' must look like PRESET or PRESET=N (N workers)"),
        ("=2", "'=2' must look like PRESET or PRESET=N (N workers)"),
    ],
)
def test_bad_sim_model_exits_2_before_anything_starts(value: str, why: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "homing", "serve", "--sim-model", value, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        f"homing: invalid option: --sim-model: {why}\n",
    )
