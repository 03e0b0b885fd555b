"""A fleet that changes while it serves, over real simulated workers (child processes):
two models served at once; workers added and drained with the `homing workers` verbs (the
real binary, over the admin socket) while 50 streams run; cordoned, refused when they serve
another model, removed, and never credited with the prefixes of an earlier life."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import grpc
import pytest
import pytest_asyncio
from helpers import eventually, own_app

from homing.app import App
from homing.config import (
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    ModelSettings,
    SimSettings,
)
from homing.engines.lifecycle import Phase
from homing.fleet import DuplicateWorker, Fleet, WrongPhase
from homing.router import RouteDecision
from homing.sim.process import spawn_sim, terminate

SMALL = "llama-3.1-8b"
LARGE = "llama-3.1-70b"

pytestmark = pytest.mark.asyncio(loop_scope="module")


def config() -> HomingConfig:
    """Two simulated models at 10x speed with fast health probes; the admin socket at its
    default (a state directory of this App's own under the test suite)."""
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        engines=EngineSettings(health_interval_s=0.1, unhealthy_threshold=2),
        models=[
            ModelSettings(name=SMALL, sim=SimSettings(workers=2, speedup=10.0)),
            ModelSettings(name=LARGE, sim=SimSettings(model=LARGE, workers=1, speedup=10.0)),
        ],
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    async with own_app(config()) as running:
        yield running


def fleet_of(app: App) -> Fleet:
    assert app.fleet is not None
    return app.fleet


@dataclass
class SpareSim:
    """A simulated worker started outside the App, to be added to it."""

    process: asyncio.subprocess.Process
    url: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def spare() -> AsyncIterator[list[SpareSim]]:
    """Spare sims started on demand (`start_sim`), all stopped after the module."""
    started: list[SpareSim] = []
    yield started
    await terminate((s.process for s in started), 2.0)


async def start_sim(started: list[SpareSim], model: str = SMALL, *extra: str) -> SpareSim:
    args = ["--workers", "1", "--port", "0", "--model", model, "--speedup", "10"]
    args += ["--parent-pid", str(os.getpid()), *extra]
    process, ready = await spawn_sim(args)
    sim = SpareSim(process, ready["workers"][0]["url"])
    started.append(sim)
    return sim


async def homing(app: App, *args: str) -> tuple[int, str, str]:
    """Run the real `homing ARGS --admin unix:SOCKET` against `app`; (exit code, stdout,
    stderr)."""
    assert app.admin is not None and app.admin.socket_path is not None
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "homing",
        *args,
        "--admin",
        f"unix:{app.admin.socket_path}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def base(app: App) -> str:
    return f"http://127.0.0.1:{app.http_port}"


@dataclass
class StreamResult:
    """One streamed completion: status, serving worker, finish reason, error code."""

    status: int
    worker: str | None
    finish: str | None = None
    error: str | None = None
    chunks: int = 0


async def stream(
    session: aiohttp.ClientSession,
    app: App,
    model: str,
    max_tokens: int,
    started: asyncio.Event | None = None,
    prompt: list[int] | None = None,
) -> StreamResult:
    """A streamed token-id completion read to `[DONE]`; `started` is set at its first chunk."""
    body = {
        "model": model,
        "prompt": prompt or list(range(1000, 1064)),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    async with session.post(f"{base(app)}/v1/completions", json=body) as resp:
        result = StreamResult(resp.status, resp.headers.get("x-homing-worker"))
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                result.error = event["error"]["code"]
                continue
            result.chunks += 1
            if started is not None:
                started.set()
            reason = event["choices"][0].get("finish_reason")
            if reason:
                result.finish = reason
        return result


async def complete(
    session: aiohttp.ClientSession, app: App, model: str, prompt: list[int] | None = None
) -> tuple[int, str | None, int]:
    """A non-streamed completion: (status, serving worker, cached prompt tokens)."""
    body = {"model": model, "prompt": prompt or [5, 6, 7, 8], "max_tokens": 2, "ignore_eos": True}
    async with session.post(f"{base(app)}/v1/completions", json=body) as resp:
        doc = await resp.json()
        cached = 0
        if resp.status == 200:
            cached = (doc["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return resp.status, resp.headers.get("x-homing-worker"), cached


@dataclass
class DecisionLog:
    """Router observer recording every decision of one model (in order), passing each on."""

    inner: object
    seen: list[RouteDecision] = field(default_factory=list)

    def on_decision(self, decision: RouteDecision) -> None:
        self.seen.append(decision)
        self.inner.on_decision(decision)  # type: ignore[attr-defined]

    def on_kv_batch(self, worker_id: str, counts: object, lag_s: float | None) -> None:
        self.inner.on_kv_batch(worker_id, counts, lag_s)  # type: ignore[attr-defined]

    def on_flush(self, worker_id: str, reason: str) -> None:
        self.inner.on_flush(worker_id, reason)  # type: ignore[attr-defined]


async def test_two_models_each_request_served_by_its_own_models_workers(app: App) -> None:
    """`/v1/models` lists both models; 20 requests to each land only on that model's
    workers, and both of the small model's workers serve."""
    fleet = fleet_of(app)
    own = {name: {w.worker_id for w in m.workers()} for name, m in fleet.models.items()}
    assert len(own[SMALL]) == 2 and len(own[LARGE]) == 1 and not own[SMALL] & own[LARGE]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base(app)}/v1/models") as resp:
            listed = [m["id"] for m in (await resp.json())["data"]]
        results = await asyncio.gather(
            *(
                complete(session, app, model, [7000 + 64 * i + j for j in range(40)])
                for i in range(20)
                for model in (SMALL, LARGE)
            )
        )
    assert listed == [SMALL, LARGE]
    by_model: dict[str, Counter[str]] = {SMALL: Counter(), LARGE: Counter()}
    for (status, worker, _), model in zip(results, [SMALL, LARGE] * 20, strict=True):
        assert status == 200 and worker is not None
        by_model[model][worker] += 1
    assert set(by_model[SMALL]) == own[SMALL]
    assert set(by_model[LARGE]) == own[LARGE]


async def test_worker_added_with_the_cli_while_50_streams_run_gets_requests(
    app: App, spare: list[SpareSim]
) -> None:
    """`homing workers add` while 50 streams run: the worker joins `ready` with its version
    and then serves new requests; the 50 streams all end normally."""
    fleet = fleet_of(app)
    sim = await start_sim(spare)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
        first = asyncio.Event()
        streams = [
            asyncio.ensure_future(stream(session, app, SMALL, 3000, first)) for _ in range(50)
        ]
        await asyncio.wait_for(first.wait(), 30)
        code, out, err = await homing(
            app, "workers", "add", SMALL, sim.url, "--version", "v2", "--output", "json"
        )
        assert (code, err) == (0, "")
        added = json.loads(out)
        worker_id = added["id"]
        state = fleet.model(SMALL).pool.state(worker_id)
        # Ready at once, or (its first check slow on a loaded machine) once a probe passes.
        assert await eventually(lambda: state.phase is Phase.READY and state.healthy, 30)
        assert state.version == "v2"
        assert sum(1 for r in streams if not r.done()) > 0  # added while streams ran
        served: Counter[str | None] = Counter()
        for i in range(30):
            prompt = [9000 + 50 * i + j for j in range(40)]
            _, worker, _ = await complete(session, app, SMALL, prompt)
            served[worker] += 1
        results = await asyncio.gather(*streams)
    assert served[worker_id] > 0
    assert all(r.status == 200 and r.finish == "length" and r.error is None for r in results)
    await fleet.remove(worker_id)


async def test_cli_drain_wait_during_50_streams_cuts_none_and_routes_nothing_new(
    app: App, spare: list[SpareSim]
) -> None:
    """`homing workers drain ID --wait` on a worker serving some of 50 streams: no stream is
    cut, no request is routed to it once it drains, the command returns (exit 0) only after
    its last stream ended and it left, and the router holds nothing of it afterwards. (A
    spare worker joins first, so the model keeps two.)"""
    fleet = fleet_of(app)
    model = fleet.model(SMALL)
    await fleet.add_worker(SMALL, (await start_sim(spare)).url)
    log = DecisionLog(model.router.observer)
    model.router.observer = log  # type: ignore[assignment]
    ended: dict[int, float] = {}
    loop = asyncio.get_running_loop()

    async def timed(i: int, started: asyncio.Event) -> StreamResult:
        prompt = [20_000 + 64 * i + j for j in range(64)]
        result = await stream(session, app, SMALL, 150, started, prompt)
        ended[i] = loop.time()
        return result

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
            first = asyncio.Event()
            streams = [asyncio.ensure_future(timed(i, first)) for i in range(50)]
            await asyncio.wait_for(first.wait(), 30)
            assert await eventually(lambda: len(log.seen) == 50, 10)
            victim = Counter(d.worker_id for d in log.seen).most_common(1)[0][0]
            assert model.pool.state(victim).in_flight > 0
            drain = asyncio.ensure_future(homing(app, "workers", "drain", victim, "--wait"))
            assert await eventually(
                lambda: (
                    not model.pool.has(victim) or model.pool.state(victim).phase is Phase.DRAINING
                ),
                60,
            )
            mark = len(log.seen)
            later = await asyncio.gather(
                *(
                    complete(session, app, SMALL, [30_000 + 50 * i + j for j in range(40)])
                    for i in range(20)
                )
            )
            code, out, err = await drain
            returned = loop.time()
            results = await asyncio.gather(*streams)
    finally:
        model.router.observer = log.inner  # type: ignore[assignment]
    assert (code, err) == (0, ""), out
    on_victim = [i for i, r in enumerate(results) if r.worker == victim]
    assert on_victim and all(ended[i] <= returned for i in on_victim)
    assert all(r.status == 200 and r.finish == "length" and r.error is None for r in results)
    assert all(d.worker_id != victim for d in log.seen[mark:])
    assert all(status == 200 and worker != victim for status, worker, _ in later)
    assert not model.pool.has(victim)
    assert model.router.index.worker_blocks(victim) == 0
    assert victim not in model.router.index.modes()


async def test_cordoned_worker_gets_nothing_new_until_uncordoned(app: App) -> None:
    """A cordoned worker stays in the pool and gets no request; uncordoned it serves again;
    cordoning a cordoned one leaves it so."""
    fleet = fleet_of(app)
    model = fleet.model(SMALL)
    target = model.workers()[0].worker_id
    fleet.cordon(target)
    assert fleet.cordon(target).phase is Phase.CORDONED  # idempotent, as kubectl's
    async with aiohttp.ClientSession() as session:
        during = [
            await complete(session, app, SMALL, [40_000 + 50 * i + j for j in range(40)])
            for i in range(10)
        ]
        fleet.uncordon(target)
        after = Counter()
        for i in range(40):
            _, worker, _ = await complete(
                session, app, SMALL, [50_000 + 50 * i + j for j in range(40)]
            )
            after[worker] += 1
    assert all(status == 200 and worker != target for status, worker, _ in during)
    assert model.pool.state(target).phase is Phase.READY
    assert after[target] > 0


async def test_worker_of_another_model_is_refused_and_not_kept(
    app: App, spare: list[SpareSim]
) -> None:
    """Adding a worker that serves the large model to the small model's pool is refused with
    both names in the message; nothing of it stays in the pool."""
    fleet = fleet_of(app)
    sim = await start_sim(spare, LARGE)
    before = [w.worker_id for w in fleet.model(SMALL).workers()]
    with pytest.raises(WrongPhase) as refused:
        await fleet.add_worker(SMALL, sim.url)
    assert str(refused.value) == (
        f"refused: worker {sim.url} serves model '{LARGE}', the pool serves '{SMALL}'"
    )
    assert [w.worker_id for w in fleet.model(SMALL).workers()] == before
    taken = fleet.model(LARGE).workers()[0].url
    with pytest.raises(DuplicateWorker, match="is already worker"):
        await fleet.add_worker(SMALL, taken)
    port = int(taken.rsplit(":", 1)[1])
    with pytest.raises(DuplicateWorker, match="is already worker"):  # the same engine
        await fleet.add_worker(SMALL, f"grpc://LOCALHOST:000{port}")


async def test_worker_with_another_tokenizer_revision_is_refused(
    app: App, spare: list[SpareSim]
) -> None:
    """A worker of the right model whose tokenizer bundle has another sha256 (another
    revision) is refused, over the admin CLI too (exit 1, the reason on stderr)."""
    fleet = fleet_of(app)
    sim = await start_sim(spare, SMALL, "--tokenizer-revision", "2")
    before = [w.worker_id for w in fleet.model(SMALL).workers()]
    code, out, err = await homing(app, "workers", "add", SMALL, sim.url)
    ours = fleet.model(SMALL).pool.state(before[0]).tokenizer_sha256
    assert ours is not None
    assert (code, out) == (1, "")
    assert err.startswith(f"homing: refused: worker {sim.url} has tokenizer bundle sha256 ")
    assert err.endswith(f"..., the pool's is {ours[:12]}... (another tokenizer or revision)\n")
    assert [w.worker_id for w in fleet.model(SMALL).workers()] == before


async def test_readded_worker_is_a_new_worker_without_its_old_prefixes(
    app: App, spare: list[SpareSim]
) -> None:
    """A worker removed and added again at the same URL gets a new id and no credit in the
    index for what it cached in its earlier life."""
    fleet = fleet_of(app)
    model = fleet.model(SMALL)
    sim = await start_sim(spare)
    first = await fleet.add_worker(SMALL, sim.url)
    prompt = list(range(60_000, 60_512))
    others = [w.worker_id for w in model.workers() if w.worker_id != first.worker_id]
    for other in others:
        fleet.cordon(other)  # only the new worker takes requests
    try:
        async with aiohttp.ClientSession() as session:
            status, worker, _ = await complete(session, app, SMALL, prompt)
        assert status == 200 and worker == first.worker_id
        assert await eventually(
            lambda: model.router.index.match(prompt).get(first.worker_id, 0) >= 512, 5
        )
        await fleet.remove(first.worker_id)
        again = await fleet.add_worker(SMALL, sim.url)
    finally:
        for other in others:
            fleet.uncordon(other)
    assert again.worker_id != first.worker_id
    assert model.router.index.match(prompt) == {}
    await fleet.remove(again.worker_id)


async def test_drain_timeout_ends_open_streams_with_an_explicit_error(app: App) -> None:
    """A drain whose streams outlast its timeout ends each of them with a `worker_drained`
    error event, then the worker leaves; the other worker keeps serving."""
    fleet = fleet_of(app)
    model = fleet.model(SMALL)
    target, *others = (w.worker_id for w in model.workers())
    for other in others:
        fleet.cordon(other)  # the streams all go to `target`
    async with aiohttp.ClientSession() as session:
        first = asyncio.Event()
        streams = [
            asyncio.ensure_future(stream(session, app, SMALL, 4000, first)) for _ in range(5)
        ]
        await asyncio.wait_for(first.wait(), 30)
        assert await eventually(lambda: model.pool.state(target).in_flight == 5, 10)
        for other in others:
            fleet.uncordon(other)
        fleet.drain(target, timeout_s=0.5)
        results = await asyncio.gather(*streams)
        assert await fleet.wait_gone(target, 10)
        status, worker, _ = await complete(session, app, SMALL)
    assert all(r.worker == target and r.error == "worker_drained" for r in results)
    assert all(r.finish is None for r in results)
    assert status == 200 and worker in others


async def test_cordoning_every_worker_makes_the_instance_not_ready(app: App) -> None:
    """With every worker of both models cordoned, `/ready` is 503 and the gRPC health
    service says NOT_SERVING; uncordoning one worker brings both back."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    fleet = fleet_of(app)
    everyone = [w.worker_id for _, w in fleet.workers()]
    for worker_id in everyone:
        fleet.cordon(worker_id)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)

        async def status() -> int:
            return (await health.Check(health_pb2.HealthCheckRequest(service=""))).status

        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base(app)}/ready") as resp:
                    cordoned = resp.status
                down = await status()
                fleet.uncordon(everyone[-1])
                async with session.get(f"{base(app)}/ready") as resp:
                    back = resp.status
                for _ in range(100):  # the health service is set by a task of its own
                    if await status() == health_pb2.HealthCheckResponse.SERVING:
                        break
                    await asyncio.sleep(0.01)
                up = await status()
        finally:
            for worker_id in everyone[:-1]:
                fleet.uncordon(worker_id)
    assert (cordoned, back) == (503, 200)
    assert down == health_pb2.HealthCheckResponse.NOT_SERVING
    assert up == health_pb2.HealthCheckResponse.SERVING
