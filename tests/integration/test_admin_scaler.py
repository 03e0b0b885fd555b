"""The autoscaler as an operator sees it: `GetScaler` on a running App's admin socket (the
scaler enabled over simulated workers started by its local actuator), read through the real
`homing` binary (`homing scaler status`, `homing scaler advise`, `homing top --once`): the
latest decision after a step, advice that changes nothing, an unknown model's refusal, and
the one line a gateway without an autoscaler gives.

Ticks are driven by the test (`app.scaler.step()`, the background tick set to an hour), so
each decision happens at a known point. The actuator starts the pool's one replica
(min_replicas 1); the test then raises the pool's min_replicas to 2 (`PoolScaler.reconfigure`,
as a reload does), so a decision wants one more replica than there is. The status and top
tests run in advisory mode, so that decision never changes the counts they read.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import pytest_asyncio
from helpers import app_factory, own_app

from homing.admin.client import AdminClient, AdminError
from homing.admin.commands import ADVISE_UNCHANGED
from homing.admin.server import UNAUTHENTICATED_MESSAGE
from homing.app import App
from homing.config import (
    AdminKeySettings,
    AdminSettings,
    GatewaySettings,
    HomingConfig,
    ScalerSettings,
    SimSettings,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"
HOUR = 3600.0
ADMIN_KEY = "adm-scaler-key"

#: The console script beside this interpreter (`.venv/bin/homing`), else `python -m homing`.
_SCRIPT = shutil.which("homing", path=os.path.dirname(sys.executable))
HOMING = [_SCRIPT] if _SCRIPT else [sys.executable, "-m", "homing"]

#: The sizing chain's first steps, in the policy's order (`homing.scaler.policy`).
CHAIN_HEAD = ["demand_streams", "prefill_demand_tok_s", "decode_replicas", "prefill_replicas"]


@pytest.fixture(scope="module")
def state_dir() -> Iterator[str]:
    """A short state directory of the module's own (Unix socket paths are short)."""
    with tempfile.TemporaryDirectory(prefix="scl-") as path:
        yield path


def _config(state: str, scaler: bool = True, **settings: Any) -> HomingConfig:
    """Simulated workers at 10x speed, an admin key, and (with `scaler`) the autoscaler at
    1..3 replicas, two streams per replica, ticking only when the test steps it."""
    scaler_settings = {
        "enabled": scaler,
        "tick_s": HOUR,
        "min_replicas": 1,
        "max_replicas": 3,
        "headroom": 0.0,
        "decode_streams_per_replica": 2.0,
        "prefill_tokens_per_s_per_replica": 1e9,
        "warm_replicas": 0,
        "default_cold_start_s": 5.0,
        "startup_timeout_s": 60.0,
        **settings,
    }
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        sim=SimSettings(workers=1, speedup=10.0),
        scaler=ScalerSettings(**scaler_settings),
        admin=AdminSettings(
            state_dir=tempfile.mkdtemp(prefix="a-", dir=state),
            keys=[
                AdminKeySettings(id="ops", sha256=hashlib.sha256(ADMIN_KEY.encode()).hexdigest())
            ],
        ),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def advisory(state_dir: str) -> AsyncIterator[App]:
    """An App whose scaler decides and never acts (its counts stay as they are)."""
    async with own_app(_config(state_dir, mode="advisory")) as app:
        yield app


@pytest_asyncio.fixture(loop_scope="module")
async def make_app(state_dir: str) -> AsyncIterator[Any]:
    """`await make_app(scaler=..., **scaler settings)`: a started App, stopped after the
    test."""
    async with app_factory(lambda **kw: _config(state_dir, **kw)) as make:
        yield make


@dataclass
class Done:
    """One finished `homing` command."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def address_of(app: App) -> str:
    assert app.admin is not None and app.admin.socket_path is not None
    return f"unix:{app.admin.socket_path}"


async def homing(app: App, *args: str, key: str | None = ADMIN_KEY) -> Done:
    """Run `homing ARGS --admin <app's socket>` (stdout a pipe: json unless --output)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOMING_ADMIN", "HOMING_ADMIN_KEY")}
    if key is not None:
        env["HOMING_ADMIN_KEY"] = key
    proc = await asyncio.create_subprocess_exec(
        *HOMING,
        *args,
        "--admin",
        address_of(app),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


def _pool(app: App) -> Any:
    assert app.scaler is not None
    (pool,) = app.scaler.pools
    return pool


def want_two(app: App) -> Any:
    """Raise the pool's min_replicas to 2 (one more than it holds); its `PoolScaler`."""
    pool = _pool(app)
    pool.reconfigure(dataclasses.replace(pool.config, min_replicas=2))
    return pool


async def test_status_after_a_step_shows_its_decision(advisory: App) -> None:
    """Before any tick the pool is listed with no decision; after a step `scaler status`
    gives that step's decision (2 ready wanted at min 2, 1 ready) with the live counts,
    bounds, actuator and capacity, as JSON and as a table row."""
    before = (await homing(advisory, "scaler", "status")).json()
    assert [p["model"] for p in before["pools"]] == [MODEL]
    assert before["pools"][0]["last"] is None

    want_two(advisory)
    assert advisory.scaler is not None
    d = (await advisory.scaler.step())[MODEL]
    assert d.desired_ready == 2

    done = await homing(advisory, "scaler", "status")
    assert (done.code, done.err) == (0, "")
    (pool,) = done.json()["pools"]
    assert {k: pool[k] for k in ("model", "mode", "actuator", "min_replicas", "max_replicas")} == {
        "model": MODEL,
        "mode": "advisory",
        "actuator": "local",
        "min_replicas": 2,
        "max_replicas": 3,
    }
    assert (pool["ready"], pool["warm"], pool["starting"], pool["draining"]) == (1, 0, 0, 0)
    cold = _pool(advisory).actuator.cold_start_s()  # measured when it started the replica
    assert cold is not None and pool["cold_start_s"] == pytest.approx(cold)
    assert pool["default_cold_start_s"] == 5.0
    assert pool["decode_streams_per_replica"] == 2.0
    last = pool["last"]
    assert (last["desired_ready"], last["desired_warm"], last["reason"]) == (2, 0, d.reason)
    assert last["held_by"] == d.held_by
    names, values = zip(*d.chain.steps(), strict=True)
    assert [c["name"] for c in last["chain"]] == list(names)
    assert [c["value"] for c in last["chain"]] == pytest.approx(list(values))
    assert last["signals"]["ready"] == 1 and last["signals"]["in_flight"] == 0
    assert pool["advice"] is None  # only `advise` asks for it

    table = await homing(advisory, "scaler", "status", "--output", "table")
    header, row = table.out.splitlines()
    assert header.split()[:4] == ["MODEL", "MODE", "ACTUATOR", "READY"]
    cells = row.split()
    assert cells[:10] == [MODEL, "advisory", "local", "1", "0", "0", "0", "2", "0", "2..3"]
    assert cells[10] == d.reason
    assert f"{cold:.1f} s" in row and "2 streams, 1e+09 prefill tok/s" in row


async def test_advise_decides_now_and_changes_nothing(make_app: Any) -> None:
    """`scaler advise` gives the decision a tick would make now (2 ready at min 2) with its
    chain, and says nothing was changed: no member was asked of the actuator, no worker
    moved, and the policy's history and capacity estimate are as before, so the next
    step decides the same, and that step (which does act) starts the missing replica."""
    app = await make_app()
    pool = want_two(app)
    assert app.pool is not None
    policy_before = copy.deepcopy(vars(pool.policy))
    estimate_before = (pool.estimator.decode_streams, pool.estimator.prefill_tokens_per_s)
    workers_before = [(w.worker_id, w.phase) for w in app.pool.workers()]
    members_before = [(m.member_id, m.state) for m in pool.actuator.members()]
    assert len(members_before) == 1  # the replica it started for min_replicas 1

    done = await homing(app, "scaler", "advise")
    assert (done.code, done.err) == (0, "")
    (data,) = done.json()["pools"]
    advice = data["advice"]
    assert (advice["desired_ready"], advice["desired_warm"]) == (2, 0)
    steps = [c["name"] for c in advice["chain"]]
    assert steps[:4] == CHAIN_HEAD and {"raw", "with_headroom", "need"} <= set(steps)
    assert advice["signals"]["ready"] == 1
    assert data["last"] is None  # advice is not a tick

    table = await homing(app, "scaler", "advise", "--model", MODEL, "--output", "table")
    assert table.code == 0
    lines = table.out.splitlines()
    title = f"{MODEL} (active, local actuator, replicas 2..3): would decide ready 2 warm 0"
    assert lines[0].startswith(title)
    assert lines[1].split() == ["STEP", "VALUE"]
    assert [line.split()[0] for line in lines[2:6]] == CHAIN_HEAD
    assert lines[-1] == ADVISE_UNCHANGED
    assert lines[-2] == "last tick: none yet"

    assert [(m.member_id, m.state) for m in pool.actuator.members()] == members_before
    assert [(w.worker_id, w.phase) for w in app.pool.workers()] == workers_before
    assert vars(pool.policy) == policy_before
    estimate = (pool.estimator.decode_streams, pool.estimator.prefill_tokens_per_s)
    assert estimate == estimate_before
    assert pool.last is None

    assert app.scaler is not None
    d = (await app.scaler.step())[MODEL]
    assert (d.desired_ready, d.desired_warm, d.reason) == (2, 0, advice["reason"])
    assert [name for name, _ in d.chain.steps()] == steps
    assert len(pool.actuator.members()) == 2  # the step acts, where the advice did not


async def test_top_shows_a_line_per_autoscaled_model(advisory: App) -> None:
    """`homing top --once` draws `scaler <model>: <mode> ready R/desired D warm W starting S
    draining X (<reason>)` from GetScaler, and its JSON carries the pools."""
    assert advisory.scaler is not None
    d = (await advisory.scaler.step())[MODEL]
    url = f"http://127.0.0.1:{advisory.http_port}"
    done = await homing(advisory, "top", "--url", url, "--once", "--interval", "0.05")
    assert done.code == 0, done.err
    line = f"scaler {MODEL}: advisory ready 1/desired 2 warm 0 starting 0 draining 0 ({d.reason})"
    assert line in done.out.splitlines()
    as_json = await homing(
        advisory, "top", "--url", url, "--once", "--interval", "0.05", "--output", "json"
    )
    data = as_json.json()
    assert [p["model"] for p in data["scalers"]] == [MODEL]
    assert data["scalers"][0]["last"]["desired_ready"] == 2
    assert "scaler_error" not in data


@pytest.mark.parametrize("verb", ["status", "advise"])
async def test_unknown_model_exits_1_with_the_servers_message(advisory: App, verb: str) -> None:
    """`--model` naming no served model: NOT_FOUND, printed as one line, exit 1."""
    message = f"no model 'nope' is served (served: {MODEL})"
    done = await homing(advisory, "scaler", verb, "--model", "nope")
    assert (done.code, done.out, done.err) == (1, "", f"homing: {message}\n")
    async with AdminClient(address_of(advisory), key=ADMIN_KEY) as admin:
        with pytest.raises(AdminError) as caught:
            await admin.get_scaler("nope", advise=verb == "advise")
    assert (caught.value.code, caught.value.message) == (grpc.StatusCode.NOT_FOUND, message)


async def test_scaler_needs_the_admin_key(advisory: App) -> None:
    """Without the admin key GetScaler is UNAUTHENTICATED, like every admin call."""
    done = await homing(advisory, "scaler", "status", key=None)
    assert (done.code, done.err) == (1, f"homing: {UNAUTHENTICATED_MESSAGE}\n")


async def test_no_autoscaler_says_so_in_one_line_and_exits_0(make_app: Any) -> None:
    """With no model autoscaled, status and advise print one line and exit 0 (JSON: no
    pools), `--model` of a served model names it, and top draws no scaler line."""
    app = await make_app(scaler=False)
    assert app.scaler is None
    expected = "homing: no model is autoscaled (enable it with [scaler] enabled = true)\n"
    for verb in ("status", "advise"):
        table = await homing(app, "scaler", verb, "--output", "table")
        assert (table.code, table.out, table.err) == (0, "", expected)
        as_json = await homing(app, "scaler", verb)
        assert (as_json.code, as_json.json(), as_json.err) == (0, {"pools": []}, expected)
    one = await homing(app, "scaler", "status", "--model", MODEL, "--output", "table")
    assert (one.code, one.out) == (0, "")
    assert one.err == f"homing: model {MODEL} is not autoscaled (its [scaler] is not enabled)\n"
    url = f"http://127.0.0.1:{app.http_port}"
    top = await homing(app, "top", "--url", url, "--once", "--interval", "0.05")
    assert top.code == 0, top.err
    assert not any(line.startswith("scaler") for line in top.out.splitlines())
    top_json = await homing(
        app, "top", "--url", url, "--once", "--interval", "0.05", "--output", "json"
    )
    assert "scalers" not in top_json.json() and "scaler_error" not in top_json.json()
