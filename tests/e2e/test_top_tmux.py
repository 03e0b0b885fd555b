"""`homing top` as an operator runs it: against a real `homing serve` (two simulated workers
at 10x speed) with real chat traffic from the official `openai` client, drawn in a detached
tmux pane of 200x50 until Ctrl-C, and `--once --output json` against the same gateway.

The tmux test is skipped where tmux is missing, unless `HOMING_REQUIRE_TMUX` is set (then it
fails)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import free_port, http_get
from openai import OpenAI

from homing.top.frame import ModelRow, WorkerRow

#: The console script beside this interpreter (`.venv/bin/homing`), else `python -m homing`.
_SCRIPT = shutil.which("homing", path=os.path.dirname(sys.executable))
HOMING = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "homing"]

WORKER_COLUMNS = ("MODEL", "WORKER", "STATE", "PHASE", "REQ/S", "TTFT p95", "IN-FLIGHT")
WORKER_COLUMNS += ("RUNNING", "WAITING", "KV", "HIT")
MODEL_COLUMNS = ("MODEL", "WORKERS", "REQ/S", "TOK/S", "IN-FLIGHT", "QUEUED", "TTFT p50")


@dataclass
class Gateway:
    """A running `homing serve`: its HTTP port, served model and environment."""

    port: int
    model: str
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    """`homing serve` on free ports with its own state dir, once `/ready` is 200."""
    state = tempfile.mkdtemp(prefix="top-")
    env = {**os.environ, "HOMING_STATE_DIR": state, "PYTHONUNBUFFERED": "1"}
    port = free_port()
    command = [*HOMING, "serve", "--port", str(port), "--grpc-port", str(free_port())]
    command += ["--speedup", "10", "--log-level", "warning"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while http_get(f"http://127.0.0.1:{port}/ready")[0] != 200:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "not ready within 60 s"
            time.sleep(0.2)
        models = json.loads(http_get(f"http://127.0.0.1:{port}/v1/models")[1])["data"]
        yield Gateway(port=port, model=models[0]["id"], env=env)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(state, ignore_errors=True)


@contextmanager
def traffic(gateway: Gateway) -> Iterator[list[int]]:
    """Chat completions (streamed and not) one after another from a thread until the block
    ends; yields the list of completed requests' counts (one element, growing)."""
    client = OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0, timeout=30)
    stop = threading.Event()
    done = [0]
    errors: list[BaseException] = []

    def run() -> None:
        i = 0
        try:
            while not stop.is_set():
                messages = [{"role": "user", "content": f"Count to {i % 7 + 2}, please."}]
                if i % 2:
                    stream = client.chat.completions.create(
                        model=gateway.model, messages=messages, max_tokens=12, stream=True
                    )
                    assert any(chunk.choices for chunk in stream)
                else:
                    reply = client.chat.completions.create(
                        model=gateway.model, messages=messages, max_tokens=12
                    )
                    assert reply.choices[0].message.content is not None
                done[0] += 1
                i += 1
        except BaseException as err:  # reported by the test's thread below
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(timeout=30)
        client.close()
    assert not errors, errors
    assert done[0] > 0


def _cells(header: str, line: str, columns: tuple[str, ...]) -> dict[str, str]:
    """`line`'s cells under the `columns` of `header` (left-aligned: a cell starts where
    its column's name does and ends where the next one starts)."""
    starts: list[int] = []
    at = 0
    for name in columns:
        at = header.index(name, at)
        starts.append(at)
    ends = [*starts[1:], len(line) + 1]
    return {n: line[s:e].strip() for n, s, e in zip(columns, starts, ends, strict=True)}


def _rows(pane: str, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of the table whose header's first two names are those of `columns`."""
    lines = pane.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:2] == list(columns[:2]) and all(c in line for c in columns):
            rows = []
            for row in lines[i + 1 :]:
                if not row.strip():
                    break
                rows.append(_cells(line, row, columns))
            return rows
    return []


NUMBER = re.compile(r"\d+(\.\d+)?")
PERCENT = re.compile(r"\d+(\.\d+)?%")


def _shows_fleet(pane: str, model: str) -> bool:
    """The model's row with a request rate (the window has two scrapes) and w0, w1 rows with
    a numeric in-flight and KV column."""
    workers = _rows(pane, WORKER_COLUMNS)
    models = _rows(pane, MODEL_COLUMNS)
    by_id = {w["WORKER"]: w for w in workers if w["MODEL"] == model}
    return (
        any(
            m["MODEL"] == model and m["WORKERS"] == "2 ready" and NUMBER.fullmatch(m["REQ/S"])
            for m in models
        )
        and set(by_id) == {"w0", "w1"}
        and all(NUMBER.fullmatch(w["IN-FLIGHT"]) for w in by_id.values())
        and all(PERCENT.fullmatch(w["KV"]) for w in by_id.values())
    )


class Tmux:
    """A tmux server of its own (socket and config in `directory`; remain-on-exit on, so a
    pane that ended can still be captured)."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        self.socket = str(directory / "tmux.sock")
        self.conf = directory / "tmux.conf"
        self.conf.write_text("set -g remain-on-exit on\nset -g history-limit 100\n")
        self.env = {k: v for k, v in env.items() if k not in ("TMUX", "TMUX_PANE")}

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, "-f", str(self.conf), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=10,
            check=True,
        )
        return done.stdout

    def pane(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def dead(self) -> bool:
        return self("display-message", "-p", "-t", "top", "#{pane_dead}").strip() == "1"


@pytest.mark.timeout(120)
def test_top_in_tmux_shows_models_and_workers_and_exits_0_on_ctrl_c(
    gateway: Gateway, tmp_path: Path
) -> None:
    if shutil.which("tmux") is None:
        if os.environ.get("HOMING_REQUIRE_TMUX"):
            pytest.fail("tmux is not installed and HOMING_REQUIRE_TMUX is set")
        pytest.skip("tmux is not installed")
    tmux = Tmux(tmp_path, gateway.env)
    status = tmp_path / "status"
    top = shlex.join([*HOMING, "top", "--url", gateway.url, "--interval", "0.5"])
    # The exit status goes to a file: tmux's #{pane_dead_status} can stay empty while the
    # server has not reaped the pane's process. bash waits for its child's own handling of
    # the Ctrl-C (the SIGINT reaches the whole foreground group) before going on.
    command = f"{top}; echo $? > {shlex.quote(str(status))}"
    try:
        with traffic(gateway):
            tmux("new-session", "-d", "-s", "top", "-x", "200", "-y", "50", "bash", "-c", command)
            deadline = time.monotonic() + 30
            pane = tmux.pane()
            while not _shows_fleet(pane, gateway.model):
                assert not tmux.dead(), f"homing top exited:\n{pane}"
                assert time.monotonic() < deadline, f"no model and worker rows in 30 s:\n{pane}"
                time.sleep(0.2)
                pane = tmux.pane()
        assert pane.splitlines()[0].startswith(f"homing top  {gateway.url}/metrics  window ")
        tmux("send-keys", "-t", "top", "C-c")
        deadline = time.monotonic() + 10
        while not status.exists() or not status.read_text().endswith("\n"):
            assert time.monotonic() < deadline, f"still running 10 s after C-c:\n{tmux.pane()}"
            time.sleep(0.1)
        after = tmux.pane()
        assert status.read_text() == "0\n", after
        assert "Traceback" not in after and "KeyboardInterrupt" not in after, after
    finally:
        subprocess.run(["tmux", "-S", tmux.socket, "kill-server"], capture_output=True, timeout=10)


# The JSON's keys are the rows' fields (`Frame.as_dict`; their order is checked in
# tests/unit/top).
MODEL_KEYS = {f.name for f in dataclasses.fields(ModelRow)}
WORKER_KEYS = {f.name for f in dataclasses.fields(WorkerRow)}


@pytest.mark.timeout(90)
def test_top_once_json_reports_the_model_and_both_workers_under_load(gateway: Gateway) -> None:
    """Over a 1 s window with requests completing in it: the model's rate and TTFT
    quantiles are numbers, its SLO lines are the defaults (0.5 s, 0.05 s, 0.95), and each
    worker has its state, in-flight, KV use and hit rate."""
    with traffic(gateway):
        done = subprocess.run(
            [*HOMING, "top", "--url", gateway.url, "--once", "--output", "json"],
            capture_output=True,
            text=True,
            env=gateway.env,
            timeout=60,
        )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    data = json.loads(done.stdout)
    assert set(data) == {"window_s", "scrapes", "models", "workers", "versions"}
    assert data["versions"] == []  # one version: no versions table
    assert data["scrapes"] == 2
    (model,) = data["models"]
    assert set(model) == MODEL_KEYS
    assert model["model"] == gateway.model and model["workers"] == {"ready": 2}
    assert model["requests_per_second"] > 0
    assert 0 < model["ttft_p50_s"] <= model["ttft_p95_s"]
    assert (model["slo_ttft_s"], model["slo_tpot_s"], model["slo_objective"]) == (0.5, 0.05, 0.95)
    assert isinstance(model["in_flight"], float) and isinstance(model["attainment_ratio"], float)
    assert [w["worker"] for w in data["workers"]] == ["w0", "w1"]
    for worker in data["workers"]:
        assert set(worker) == WORKER_KEYS
        assert worker["model"] == gateway.model and worker["state"] == "healthy"
        for key in ("in_flight", "running", "waiting", "kv_usage_ratio", "cache_hit_ratio"):
            assert isinstance(worker[key], float), (key, worker)
        assert 0 <= worker["kv_usage_ratio"] <= 1 and 0 <= worker["cache_hit_ratio"] <= 1
