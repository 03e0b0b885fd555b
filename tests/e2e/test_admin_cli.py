"""The admin verbs as an operator runs them: the real `homing` binary against a running
`homing serve` process (simulated workers, admin keys configured), found through
`$HOMING_STATE_DIR`'s default socket: listing, adding a freshly started worker, draining
with --wait, cordon/uncordon, removal, and the exit codes 1/2/3 with their stderr lines."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from homing.sim.process import spawn_sim, terminate

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN_KEY = "adm-e2e-key"

#: The console script beside this interpreter (`.venv/bin/homing`), else `python -m homing`.
_SCRIPT = shutil.which("homing", path=os.path.dirname(sys.executable))
HOMING = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "homing"]


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Done:
    """One finished `homing` command."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Gateway:
    """A running `homing serve` and the environment its admin clients use."""

    process: asyncio.subprocess.Process
    port: int
    env: dict[str, str]
    socket: str

    async def homing(self, *args: str, env: dict[str, str] | None = None) -> Done:
        """Run `homing ARGS` with the gateway's state dir and admin key in the environment."""
        proc = await asyncio.create_subprocess_exec(
            *HOMING,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env if env is not None else self.env,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return Done(proc.returncode, out.decode(), err.decode())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    """`homing serve --config` over 2 simulated workers at 10x speed with an admin key,
    serving once its admin socket exists (the admin API starts last)."""
    state = tempfile.mkdtemp(prefix="cli-")
    port = _free_port()
    config = Path(state) / "homing.toml"
    config.write_text(
        f"""
[gateway]
port = {port}
grpc_port = 0
drain_timeout_s = 2.0

[engines]
health_interval_s = 0.1
unhealthy_threshold = 2

[sim]
workers = 2
speedup = 10.0

[[admin.keys]]
id = "ops"
sha256 = "{hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}"
"""
    )
    env = {**os.environ, "HOMING_STATE_DIR": state, "PYTHONUNBUFFERED": "1"}
    env.pop("HOMING_ADMIN", None)
    env.pop("HOMING_ADMIN_KEY", None)
    process = await asyncio.create_subprocess_exec(
        *HOMING,
        "serve",
        "--config",
        str(config),
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    path = os.path.join(state, "admin.sock")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not _exists(path):
            assert process.returncode is None, "homing serve exited"
            assert loop.time() < deadline, "no admin socket within 60 s"
            await asyncio.sleep(0.1)
        yield Gateway(process, port, {**env, "HOMING_ADMIN_KEY": ADMIN_KEY}, path)
    finally:
        await terminate([process], 30.0)
        shutil.rmtree(state, ignore_errors=True)


@pytest_asyncio.fixture(loop_scope="module")
async def spare() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Simulated workers a test starts outside the gateway (`await sim(spare)`)."""
    processes: list[asyncio.subprocess.Process] = []
    yield processes
    await terminate(processes, 2.0)


async def sim(spare: list[asyncio.subprocess.Process]) -> str:
    """Start a simulated worker as `homing serve` would; its URL."""
    args = ["--workers", "1", "--port", "0", "--speedup", "10", "--parent-pid", str(os.getpid())]
    process, ready = await spawn_sim(args)
    spare.append(process)
    return str(ready["workers"][0]["url"])


async def workers(gateway: Gateway) -> list[dict[str, Any]]:
    done = await gateway.homing("workers", "ls", "--output", "json")
    assert done.code == 0, done.err
    return list(done.json()["workers"])


async def test_workers_ls_json_lists_both_workers(gateway: Gateway) -> None:
    """`workers ls` (JSON when not a terminal) lists the two ready workers with every field."""
    done = await gateway.homing("workers", "ls")
    assert (done.code, done.err) == (0, "")
    listed = done.json()["workers"]
    assert [(w["id"], w["phase"], w["healthy"]) for w in listed] == [
        ("w0", "ready", True),
        ("w1", "ready", True),
    ]
    assert set(listed[0]) == {
        "id",
        "model",
        "url",
        "version",
        "phase",
        "healthy",
        "in_flight",
        "running",
        "waiting",
        "token_usage",
        "cached_blocks",
        "kv_stream",
        "last_error",
        "kv_epoch",
        "breaker",
    }
    assert [w["breaker"] for w in listed] == ["closed", "closed"]


async def test_table_output_and_the_read_verbs(gateway: Gateway) -> None:
    """`--output table` prints a table; models, tenants and stats answer too."""
    table = await gateway.homing("workers", "ls", "--output", "table")
    assert table.code == 0 and table.out.split()[:5] == ["ID", "MODEL", "URL", "VERSION", "PHASE"]
    models = await gateway.homing("models", "ls")
    assert [(m["policy"], m["ready_workers"], m["workers"]) for m in models.json()["models"]] == [
        ("cache_aware", 2, 2)
    ]
    tenants = await gateway.homing("tenants", "ls")
    assert tenants.json() == {"tenants": [], "window_s": 0.0, "backend": "", "use_error": ""}
    stats = await gateway.homing("stats")
    assert stats.json()["models"][0]["workers"] == 2 and stats.json()["uptime_s"] > 0


async def test_add_cordon_uncordon_and_drain_wait_a_fresh_worker(
    gateway: Gateway, spare: list[asyncio.subprocess.Process]
) -> None:
    """A freshly started worker is added `ready` with its version, cordoned, uncordoned,
    and drained with --wait: the command returns once it has left."""
    model = (await gateway.homing("models", "ls")).json()["models"][0]["name"]
    url = await sim(spare)
    added = await gateway.homing("workers", "add", model, url, "--version", "v2")
    assert added.code == 0, added.err
    worker = added.json()
    assert (worker["url"], worker["version"], worker["phase"]) == (url, "v2", "ready")
    wid = worker["id"]
    cordoned = await gateway.homing("workers", "cordon", wid)
    assert (cordoned.code, cordoned.json()["phase"]) == (0, "cordoned")
    uncordoned = await gateway.homing("workers", "uncordon", wid)
    assert (uncordoned.code, uncordoned.json()["phase"]) == (0, "ready")
    drained = await gateway.homing("workers", "drain", wid, "--wait", "--timeout", "20")
    assert drained.code == 0, drained.err
    assert drained.json()["left"] is True and drained.json()["worker"]["phase"] == "gone"
    assert wid not in [w["id"] for w in await workers(gateway)]


async def test_busy_worker_drain_wait_times_out_and_rm_needs_force(
    gateway: Gateway, spare: list[asyncio.subprocess.Process]
) -> None:
    """With a request held open on a worker, `drain --wait --timeout` exits 1 saying it has
    not left; `rm` exits 1 asking for a drain or --force; `rm --force` removes it."""
    model = (await gateway.homing("models", "ls")).json()["models"][0]["name"]
    url = await sim(spare)
    wid = (await gateway.homing("workers", "add", model, url)).json()["id"]
    others = [w["id"] for w in await workers(gateway) if w["id"] != wid]
    for other in others:
        assert (await gateway.homing("workers", "cordon", other)).code == 0
    sidecar = f"http://127.0.0.1:{int(url.rsplit(':', 1)[1]) + 1}/fault"
    body = {"model": model, "prompt": list(range(500, 564)), "max_tokens": 500, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(sidecar, json={"slowdown": 10_000}) as resp:
            assert resp.status in (200, 202)
        request = asyncio.ensure_future(_read(http, f"http://127.0.0.1:{gateway.port}", body))
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while next(w for w in await workers(gateway) if w["id"] == wid)["in_flight"] != 1:
                assert loop.time() < deadline, "the request never reached the worker"
            for other in others:
                assert (await gateway.homing("workers", "uncordon", other)).code == 0
            waited = await gateway.homing(
                "workers", "drain", wid, "--wait", "--timeout", "0.5", "--grace", "60"
            )
            assert (waited.code, waited.out) == (1, "")
            assert waited.err == (
                f"homing: worker {wid} has not left after 0.5 s (1 request(s) still in "
                "flight); it is still draining and leaves when they end, or when they are cut "
                "at the drain timeout\n"
            )
            rm = await gateway.homing("workers", "rm", wid)
            assert rm.code == 1
            assert rm.err == (
                f"homing: worker {wid} has 1 request(s) in flight; drain it first (homing "
                f"workers drain {wid} --wait) or remove it with --force\n"
            )
            forced = await gateway.homing("workers", "rm", wid, "--force")
            assert (forced.code, forced.json()["phase"]) == (0, "gone")
            assert "worker_removed" in await asyncio.wait_for(request, 10)
        finally:
            request.cancel()
    assert wid not in [w["id"] for w in await workers(gateway)]


async def _read(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> str:
    """POST a completion and read its whole answer (its status line and body)."""
    async with http.post(f"{base}/v1/completions", json=body) as resp:
        return f"{resp.status} {await resp.text()}"


async def test_refusals_exit_1_with_the_servers_message(gateway: Gateway) -> None:
    """NOT_FOUND, FAILED_PRECONDITION, INVALID_ARGUMENT, ALREADY_EXISTS and UNAUTHENTICATED
    exit 1 with `homing: <message>` on stderr and nothing on stdout."""
    first = (await workers(gateway))[0]
    # Nothing listens on port 1: the worker is added but stays joining.
    joining = await gateway.homing("workers", "add", first["model"], "grpc://127.0.0.1:1")
    assert (joining.code, joining.json()["phase"]) == (0, "joining")
    cases = [
        (
            ("workers", "cordon", "w99"),
            "no worker 'w99' (list them with `homing workers ls`)",
        ),
        (
            ("workers", "cordon", joining.json()["id"]),
            f"worker {joining.json()['id']}: cannot cordon a worker that is joining",
        ),
        (
            ("workers", "add", first["model"], "http://nowhere:1"),
            "worker URL 'http://nowhere:1' must look like grpc://host:port",
        ),
        (
            ("workers", "add", first["model"], first["url"]),
            f"{first['url']} is already worker {first['id']} of model '{first['model']}'",
        ),
        (
            ("workers", "ls", "--admin-key", "wrong"),
            "a valid admin key is required (--admin-key or HOMING_ADMIN_KEY)",
        ),
    ]
    for args, message in cases:
        done = await gateway.homing(*args)
        assert (done.code, done.out, done.err) == (1, "", f"homing: {message}\n"), args
    no_key = {k: v for k, v in gateway.env.items() if k != "HOMING_ADMIN_KEY"}
    done = await gateway.homing("stats", env=no_key)
    assert (done.code, done.err) == (
        1,
        "homing: a valid admin key is required (--admin-key or HOMING_ADMIN_KEY)\n",
    )
    keyed = await gateway.homing("stats", "--admin-key", ADMIN_KEY, env=no_key)
    assert keyed.code == 0, keyed.err
    assert (await gateway.homing("workers", "rm", joining.json()["id"])).code == 0


async def test_usage_errors_exit_2(gateway: Gateway) -> None:
    """A missing argument, an unknown verb or a malformed address exits 2."""
    missing = await gateway.homing("workers", "drain")
    assert missing.code == 2
    assert "error: the following arguments are required: ID" in missing.err
    unknown = await gateway.homing("workers", "explode")
    assert unknown.code == 2 and "invalid choice: 'explode'" in unknown.err
    bad = await gateway.homing("stats", "--admin", "nowhere")
    assert (bad.code, bad.err) == (
        2,
        "homing: admin address 'nowhere' must look like unix:PATH or HOST:PORT\n",
    )
    orphan = await gateway.homing("workers", "drain", "w0", "--timeout", "3")
    assert (orphan.code, orphan.err) == (2, "homing: --timeout needs --wait\n")


async def test_unreachable_exits_3(gateway: Gateway, tmp_path: Path) -> None:
    """No socket at the address, or nothing listening on a TCP port: exit 3, stderr names
    the address; `--admin` and `HOMING_ADMIN` both pick it."""
    missing = tmp_path / "none.sock"
    done = await gateway.homing("workers", "ls", "--admin", f"unix:{missing}")
    assert (done.code, done.out) == (3, "")
    assert done.err == (
        f"homing: no admin socket at {missing}: is `homing serve` running? (pick another "
        "with --admin or HOMING_ADMIN)\n"
    )
    port = _free_port()
    done = await gateway.homing("stats", env={**gateway.env, "HOMING_ADMIN": f"127.0.0.1:{port}"})
    assert done.code == 3
    assert done.err.startswith(f"homing: cannot reach the admin API at 127.0.0.1:{port}: ")
    via_flag = await gateway.homing("stats", "--admin", f"unix:{gateway.socket}")
    assert via_flag.code == 0, via_flag.err


async def test_completion_prints_a_script() -> None:
    """`completion bash` and `completion zsh` print completion scripts naming the verbs."""
    for shell, marker in (
        ("bash", "complete -o bashdefault -F _shtab_homing homing"),
        ("zsh", "#compdef homing"),
    ):
        proc = await asyncio.create_subprocess_exec(
            *HOMING, "completion", shell, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        script = out.decode()
        assert proc.returncode == 0 and marker in script, shell
        assert "workers" in script and "drain" in script
