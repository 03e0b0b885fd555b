"""The autoscaler inside `homing serve`, over real simulated workers started by its local
actuator: a load step scales the pool up and the new replicas serve; a warm replica is
promoted at once; scale-down drains its victim (its stream completes) before stopping it;
advisory mode decides and never acts; zero traffic is safe.

Ticks are driven by the test (`app.scaler.step()`, the background tick set to an hour), so
each decision happens at a known point of the load. The Apps run on a `ManualClock`: the
scaler's windows (stable window, idle time to zero, admission queue timeout) pass when the
test moves virtual time, not by sleeping; the workers themselves run in real time. Two
tests keep the system clock, for what is real time by nature: a measured cold start of a
worker process, and a leader lease whose TTL Redis keeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers import app_factory, eventually, free_port, http_get, post_fault, worker_of_session
from stream_load import StreamLoad
from structlog.testing import capture_logs

from homing.app import App
from homing.clock import ManualClock
from homing.config import (
    GatewaySettings,
    HomingConfig,
    RouterSettings,
    ScalerSettings,
    SimSettings,
)
from homing.engines.lifecycle import Phase
from homing.scaler.actuators.base import MemberState

pytestmark = pytest.mark.asyncio

MODEL = "llama-3.1-8b"
HOUR = 3600.0


def _config(policy: str = "cache_aware", **scaler: Any) -> HomingConfig:
    settings = {
        "enabled": True,
        "tick_s": HOUR,  # the test steps the scaler itself
        "min_replicas": 1,
        "max_replicas": 3,
        "headroom": 0.0,
        "decode_streams_per_replica": 2.0,
        "prefill_tokens_per_s_per_replica": 1e9,  # decode decides in these tests
        "warm_replicas": 0,
        "default_cold_start_s": 5.0,
        "scale_down_window_s": 0.5,
        "scale_down_cooldown_s": 0.0,
        # Virtual time runs ahead of the workers' real starts (`eventually` moves it 10x):
        # no start is given up for time; the tests' real-time guards bound the waits.
        "startup_timeout_s": HOUR,
        **scaler,
    }
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        router=RouterSettings(policy=policy),
        sim=SimSettings(workers=1, speedup=10.0),
        scaler=ScalerSettings(**settings),
    )


@pytest_asyncio.fixture
async def make_app() -> AsyncIterator[Any]:
    """`await make_app(**scaler settings)`: a started App on a `ManualClock`, stopped at the
    end."""
    async with app_factory(_config, clock=ManualClock) as make:
        yield make


@pytest_asyncio.fixture
async def make_real_time_app() -> AsyncIterator[Any]:
    """`await make_real_time_app(**scaler settings)`: a started App on the system clock."""
    async with app_factory(_config) as make:
        yield make


def _phases(app: App) -> list[str]:
    assert app.pool is not None
    return sorted(w.phase.value for w in app.pool.workers())


def _ready(app: App) -> int:
    assert app.pool is not None
    return sum(1 for w in app.pool.workers() if w.phase is Phase.READY and w.healthy)


def _all_running(app: App) -> bool:
    """Every worker's latest load report shows requests running and none waiting."""
    assert app.pool is not None
    loads = [w.load for w in app.pool.workers()]
    return all(x is not None and x.running > 0 and x.waiting == 0 for x in loads)


def _clock(app: App) -> ManualClock | None:
    """`app`'s clock when it is virtual (for `eventually` to move), else None."""
    return app.clock if isinstance(app.clock, ManualClock) else None


async def _pass(app: App, seconds: float) -> None:
    """Let `seconds` of `app`'s time pass: moved on a `ManualClock` (and what that woke
    runs), slept on the system clock."""
    clock = _clock(app)
    if clock is None:
        await asyncio.sleep(seconds)
        return
    clock.advance(seconds)
    await clock.settle()


def _actuator(app: App) -> Any:
    assert app.scaler is not None
    return app.scaler.pools[0].actuator


async def _long_stream(
    app: App, session: aiohttp.ClientSession, max_tokens: int, prompt: str
) -> str:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        return (await resp.read()).decode()


async def test_a_load_step_scales_the_pool_up_and_the_new_replicas_serve(make_app: Any) -> None:
    """Six streams at two per replica: one tick asks for three replicas; the actuator starts
    two more, they join ready, and the load reaches them."""
    app = await make_app()
    assert _ready(app) == 1
    assert app.model is not None and app.scaler is not None
    async with StreamLoad(app.http_port, model=MODEL, concurrency=6, max_tokens=400) as load:
        assert await eventually(
            lambda: app.model.pool.total_in_flight >= 5, 10.0, clock=_clock(app)
        )
        decisions = await app.scaler.step()
        d = decisions[MODEL]
        assert (d.desired_ready, d.reason) == (3, "scale_up"), d
        assert await eventually(lambda: _ready(app) == 3, 60.0, clock=_clock(app)), _phases(app)
        assert await eventually(lambda: len(load.by_worker) == 3, 30.0, clock=_clock(app)), (
            load.by_worker
        )
    assert load.failed == []
    started = {w.worker_id for w in app.pool.workers()} - {"w0"}
    assert len(started) == 2 and all(load.by_worker[w] > 0 for w in started)
    members = _actuator(app).members()
    assert len(members) == 3 and all(m.state is MemberState.READY for m in members)
    assert _actuator(app).cold_start_s() > 0


async def test_a_warm_replica_is_promoted_at_once(make_app: Any) -> None:
    """With one warm replica kept, it joins cordoned (no requests); a step that needs one
    more ready replica uncordons it in that same step, with no new start needed first."""
    app = await make_app(warm_replicas=1)
    assert app.scaler is not None and app.pool is not None
    d = (await app.scaler.step())[MODEL]
    assert (d.desired_ready, d.desired_warm) == (1, 1)
    assert await eventually(
        lambda: _phases(app) == ["cordoned", "ready"], 60.0, clock=_clock(app)
    ), _phases(app)
    warm = next(w for w in app.pool.workers() if w.phase is Phase.CORDONED)
    async with StreamLoad(app.http_port, model=MODEL, concurrency=4, max_tokens=400) as load:
        assert await eventually(lambda: app.pool.total_in_flight >= 3, 10.0, clock=_clock(app))
        d = (await app.scaler.step())[MODEL]
        assert d.desired_ready == 2
        assert app.pool.state(warm.worker_id).phase is Phase.READY  # promoted in the step
        assert await eventually(lambda: load.by_worker[warm.worker_id] > 0, 10.0, clock=_clock(app))
    assert load.failed == []


async def test_scale_down_drains_its_victim_and_the_stream_on_it_completes(
    make_app: Any,
) -> None:
    """Two replicas, one slow stream on each; demand for one: the victim is drained (no new
    requests), its stream runs to its end with no error, then its process is stopped."""
    app = await make_app(policy="round_robin", min_replicas=2, max_replicas=2)
    assert app.scaler is not None and app.pool is not None
    assert await eventually(lambda: _ready(app) == 2, 30.0, clock=_clock(app))
    for w in app.pool.workers():
        await post_fault(w.url, {"slowdown": 30})
    async with aiohttp.ClientSession() as session:
        streams = [
            asyncio.create_task(_long_stream(app, session, 300, f"story {i}")) for i in range(2)
        ]
        assert await eventually(
            lambda: sorted(w.in_flight for w in app.pool.workers()) == [1, 1], 10.0
        )
        pool_scaler = app.scaler.pools[0]
        pool_scaler.reconfigure(dataclasses.replace(pool_scaler.config, min_replicas=1))
        with capture_logs() as logs:
            for _ in range(20):  # the stable window (0.5 s) passes between steps
                d = (await app.scaler.step())[MODEL]
                if d.desired_ready == 1:
                    break
                await _pass(app, 0.1)
            assert d.desired_ready == 1, d
        draining = [w for w in app.pool.workers() if w.phase is Phase.DRAINING]
        assert len(draining) == 1 and draining[0].in_flight == 1
        victim = draining[0]
        assert [e["worker"] for e in logs if e["event"] == "scaler_draining"] == [victim.worker_id]
        for w in app.pool.workers():
            await post_fault(w.url, {"slowdown": 1})
        bodies = await asyncio.gather(*streams)
    for body in bodies:
        assert body.rstrip().endswith("data: [DONE]") and '"error"' not in body
    assert await app.pool.wait_gone(victim.worker_id, 30.0)
    actuator = _actuator(app)
    assert await eventually(lambda: len(actuator.members()) == 1, 30.0, clock=_clock(app))
    assert [m.url for m in actuator.members()] != [victim.url]


async def test_advisory_mode_decides_and_never_acts(make_app: Any) -> None:
    """Advisory: the decision (three replicas) is logged and exported; no replica is started
    and the pool keeps its one worker."""
    app = await make_app(mode="advisory")
    assert app.scaler is not None and app.model is not None
    async with StreamLoad(app.http_port, model=MODEL, concurrency=6, max_tokens=400) as load:
        assert await eventually(
            lambda: app.model.pool.total_in_flight >= 5, 10.0, clock=_clock(app)
        )
        with capture_logs() as logs:
            d = (await app.scaler.step())[MODEL]
        assert d.desired_ready == 3
        decision = next(e for e in logs if e["event"] == "scaler_decision")
        assert (decision["mode"], decision["desired_ready"]) == ("advisory", 3)
        await asyncio.sleep(0)  # nothing was scheduled to act
        assert len(_actuator(app).members()) == 1 and len(app.model.pool.workers()) == 1
    assert load.failed == []
    status, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{app.http_port}/metrics")
    text = body.decode()
    assert status == 200
    assert (
        f'homing_scaler_decisions_total{{mode="advisory",model="{MODEL}",reason="scale_up"}} 1.0'
        in text
    )
    assert f'homing_scaler_desired_replicas{{kind="ready",model="{MODEL}"}} 3.0' in text


async def test_zero_traffic_scales_down_to_the_minimum_with_finite_figures(
    make_app: Any,
) -> None:
    """No request at all, three replicas, minimum one: once the stable window has passed the
    pool goes down to one (a quarter, at least one, per tick), every figure of every chain is
    finite, and no metric of the scaler is NaN."""
    app = await make_app(min_replicas=3)
    assert app.scaler is not None and app.pool is not None
    assert await eventually(lambda: _ready(app) == 3, 30.0, clock=_clock(app))
    pool_scaler = app.scaler.pools[0]
    pool_scaler.reconfigure(dataclasses.replace(pool_scaler.config, min_replicas=1))
    for _ in range(40):
        d = (await app.scaler.step())[MODEL]
        assert d.desired_warm == 0
        assert all(math.isfinite(v) for _, v in d.chain.steps()), d.chain
        if d.desired_ready == 1:
            break
        await _pass(app, 0.2)  # the stable window (0.5 s) passes between steps
    assert d.desired_ready == 1
    assert await eventually(lambda: len(_actuator(app).members()) == 1, 30.0, clock=_clock(app))
    assert await eventually(lambda: len(app.pool.workers()) == 1, 30.0, clock=_clock(app))
    status, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{app.http_port}/metrics")
    scaler_lines = [line for line in body.decode().splitlines() if "homing_scaler_" in line]
    assert status == 200 and scaler_lines
    assert not [line for line in scaler_lines if line.endswith("NaN")]


def _completion(app: App) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "wake up", "max_tokens": 4}


async def _to_zero(app: App) -> None:
    """Step the idle pool to zero replicas and wait until its last worker has left."""
    assert app.scaler is not None and app.pool is not None
    assert (await app.scaler.step())[MODEL].desired_ready == 1  # idle counts from here
    await _pass(app, 0.6)  # idle_to_zero_s (0.5 s) without a request
    d = (await app.scaler.step())[MODEL]
    assert (d.desired_ready, d.reason) == (0, "to_zero"), d
    assert await eventually(lambda: app.pool.workers() == [], 30.0, clock=_clock(app)), _phases(app)
    assert await eventually(lambda: _actuator(app).members() == [], 30.0, clock=_clock(app))


async def test_scaled_to_zero_a_request_waits_starts_a_replica_and_is_served(
    make_app: Any,
) -> None:
    """At zero the model stays listed and the gateway ready; a request waits in the admission
    queue, wakes the scaler (its own tick is an hour away), and is served by the replica that
    starts for it."""
    app = await make_app(scale_to_zero=True, min_replicas=0, idle_to_zero_s=0.5)
    await _to_zero(app)
    base = f"http://127.0.0.1:{app.http_port}"
    status, body = await asyncio.to_thread(http_get, base + "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [MODEL]
    status, body = await asyncio.to_thread(http_get, base + "/ready")
    assert status == 200
    assert json.loads(body)["models"][MODEL] == {
        "ready_workers": 0,
        "workers": 0,
        "scales_from_zero": True,
    }
    async with aiohttp.ClientSession() as session:
        waiting = asyncio.ensure_future(
            session.post(base + "/v1/completions", json=_completion(app))
        )
        # The replica's start runs in real time, its health probes on the clock.
        assert await eventually(waiting.done, 60.0, clock=_clock(app))
        async with await waiting as resp:
            assert resp.status == 200, await resp.text()
            worker = resp.headers["x-homing-worker"]
            assert (await resp.json())["usage"]["completion_tokens"] == 4
    assert app.pool is not None and [w.worker_id for w in app.pool.workers()] == [worker]


async def test_past_the_queue_timeout_at_zero_the_503_gives_the_expected_start_time(
    make_real_time_app: Any,
) -> None:
    """A request that waits longer than `queue_timeout_s` for the replica starting at zero
    gets 503 no_capacity with Retry-After = the measured cold start, rounded up. On the
    system clock: the cold start is a worker process's real start."""
    app = await make_real_time_app(scale_to_zero=True, min_replicas=0, idle_to_zero_s=0.5)
    assert app.admission is not None
    app.admission.settings = app.admission.settings.model_copy(update={"queue_timeout_s": 0.2})
    await _to_zero(app)
    cold = _actuator(app).cold_start_s()
    assert cold is not None and cold > 0.2  # longer than the queue timeout
    expected = max(1, math.ceil(cold))
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    async with aiohttp.ClientSession() as session:
        waiting = asyncio.ensure_future(session.post(url, json=_completion(app)))
        assert await eventually(lambda: app.admission.queued == 1, 10.0)  # type: ignore[union-attr]
        await _pass(app, 0.2)  # the queue timeout passes before any replica could start
        async with await waiting as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == str(expected)
            assert await resp.json() == {
                "error": {
                    "message": (
                        f"No replica of model '{MODEL}' is running; one is being started "
                        f"(about {expected} s), and the request waited 0.2 s in the admission "
                        "queue. Retry later."
                    ),
                    "type": "service_unavailable_error",
                    "param": None,
                    "code": "no_capacity",
                }
            }
    assert app.pool is not None
    # The start goes on and serves.
    assert await eventually(lambda: _ready(app) == 1, 60.0, clock=_clock(app))


async def test_of_two_instances_one_actuates_and_the_other_takes_over_when_it_stops(
    make_real_time_app: Any, redis_server: Any
) -> None:
    """Two gateways with a Redis lease on the same model: one leads; the other decides and
    reports as a follower but starts nothing; once the leader stops (releasing its lease) the
    follower leads within a lease and acts. On the system clock: the electors renew a lease
    whose TTL Redis keeps in real time."""
    # A 3 s lease, renewed every second: a loaded machine does not let it lapse.
    leased = {"leader": "redis", "leader_lease_s": 3.0, "leader_redis_url": redis_server.url}
    first = await make_real_time_app(**leased)
    second = await make_real_time_app(**leased)
    apps = [first, second]
    electors = [a.scaler.pools[0].elector for a in apps]
    assert await eventually(lambda: sum(e.is_leader for e in electors) == 1, 10.0)
    leader, follower = apps if electors[0].is_leader else apps[::-1]
    assert follower.model is not None
    async with StreamLoad(follower.http_port, model=MODEL, concurrency=6, max_tokens=400):
        assert await eventually(
            lambda: follower.model.pool.total_in_flight >= 5, 10.0, clock=_clock(follower)
        )
        with capture_logs() as logs:
            d = (await follower.scaler.step())[MODEL]
        assert d.desired_ready == 3
        decision = next(e for e in logs if e["event"] == "scaler_decision")
        assert decision["mode"] == "follower"
        assert len(_actuator(follower).members()) == 1  # it did not act
        old_token = leader.scaler.pools[0].elector.token
        await leader.stop()
        elector = follower.scaler.pools[0].elector
        assert not elector.is_leader
        assert await eventually(lambda: elector.is_leader, 5.0)  # its next renewal, 1 s
        assert elector.token > old_token
        # It acts now (the capacity it measured meanwhile may ask for fewer than three).
        d = (await follower.scaler.step())[MODEL]
        assert d.desired_ready > 1
        assert await eventually(lambda: len(_actuator(follower).members()) == d.desired_ready, 10.0)


async def test_an_unreachable_lease_store_reports_lease_unreachable_and_acts_on_nothing(
    make_app: Any,
) -> None:
    """The Redis of the lease refuses connections: the instance never leads, its decisions
    say "lease-unreachable" (not "follower": it cannot know whether any instance acts), the
    elector names the error, and nothing is started."""
    leased = {
        "leader": "redis",
        "leader_lease_s": 1.0,
        "leader_redis_url": f"redis://127.0.0.1:{free_port()}/0",
    }
    app = await make_app(**leased)
    elector = app.scaler.pools[0].elector
    assert await eventually(lambda: elector.store_error is not None, 10.0, clock=_clock(app))
    assert "Connection" in elector.store_error or "connect" in elector.store_error
    with capture_logs() as logs:
        await app.scaler.step()
    decision = next(e for e in logs if e["event"] == "scaler_decision")
    assert decision["mode"] == "lease-unreachable" and not elector.is_leader
    assert len(_actuator(app).members()) == 1  # the replica it started with, nothing more


async def test_scale_down_during_30_streams_cuts_none(make_app: Any) -> None:
    """Three replicas with ten streams each and demand for one (30 streams, 30 per replica):
    the scaler drains two victims over two windows, every one of the 30 streams completes
    with no error, and the pool ends with one replica."""
    app = await make_app(policy="round_robin", min_replicas=3, decode_streams_per_replica=30.0)
    assert app.scaler is not None and app.pool is not None
    assert await eventually(lambda: _ready(app) == 3, 30.0, clock=_clock(app))
    for w in app.pool.workers():
        await post_fault(w.url, {"slowdown": 10})
    pool_scaler = app.scaler.pools[0]
    pool_scaler.reconfigure(dataclasses.replace(pool_scaler.config, min_replicas=1))
    async with aiohttp.ClientSession() as session:
        streams = [
            asyncio.create_task(_long_stream(app, session, 600, f"story {i}")) for i in range(30)
        ]
        assert await eventually(lambda: app.pool.total_in_flight == 30, 20.0, clock=_clock(app))
        # Every engine runs its ten and reports none waiting before the scaler steps: a load
        # report still showing the streams' first wait on every ready replica for two ticks
        # is the saturation indicator (rule 2), which would add a replica mid-test.
        assert await eventually(lambda: _all_running(app), 20.0, clock=_clock(app))
        drained: set[str] = set()
        for _ in range(60):
            await app.scaler.step()
            drained |= {w.worker_id for w in app.pool.workers() if w.phase is Phase.DRAINING}
            if len(drained) == 2:
                break
            await _pass(app, 0.2)  # the stable window (0.5 s) passes between steps
        assert len(drained) == 2, _phases(app)
        bodies = await asyncio.gather(*streams)
    cut = [b[-300:] for b in bodies if not b.rstrip().endswith("data: [DONE]") or '"error"' in b]
    assert cut == []
    assert await eventually(lambda: len(app.pool.workers()) == 1, 30.0, clock=_clock(app)), _phases(
        app
    )
    assert await eventually(lambda: len(_actuator(app).members()) == 1, 30.0, clock=_clock(app))


async def test_the_victim_is_the_replica_with_least_cache_value(make_app: Any) -> None:
    """Two idle replicas; w0 holds the prefixes of eight long prompts only it served, w1
    none: scaling down to one drains w1 (with equal cache the tie would take w0, the lower
    id), and w0 still holds its blocks afterwards."""
    app = await make_app(policy="consistent_hash", min_replicas=2)
    assert app.scaler is not None and app.pool is not None and app.router is not None
    assert await eventually(lambda: _ready(app) == 2, 30.0, clock=_clock(app))
    session = ""
    for i in range(64):  # a session the ring gives w0
        if await worker_of_session(app, MODEL, f"s{i}") == "w0":
            session = f"s{i}"
            break
    assert session
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    async with aiohttp.ClientSession() as http:
        for i in range(8):
            body = {"model": MODEL, "prompt": f"document {i}: " + "words " * 300, "max_tokens": 2}
            async with http.post(url, json=body, headers={"x-session-id": session}) as resp:
                assert resp.status == 200 and resp.headers["x-homing-worker"] == "w0"
    assert await eventually(
        lambda: app.router.cache_values(["w0"])["w0"].unique_blocks >= 100, 10.0
    ), app.router.cache_values(["w0", "w1"])
    assert app.router.cache_values(["w1"])["w1"].unique_blocks == 0
    pool_scaler = app.scaler.pools[0]
    pool_scaler.reconfigure(dataclasses.replace(pool_scaler.config, min_replicas=1))
    with capture_logs() as logs:
        for _ in range(40):
            d = (await app.scaler.step())[MODEL]
            if d.desired_ready == 1:
                break
            await _pass(app, 0.1)
    assert [e["worker"] for e in logs if e["event"] == "scaler_draining"] == ["w1"]
    assert await app.pool.wait_gone("w1", 30.0)
    assert [w.worker_id for w in app.pool.workers()] == ["w0"]
    assert app.router.cache_values(["w0"])["w0"].unique_blocks >= 100
