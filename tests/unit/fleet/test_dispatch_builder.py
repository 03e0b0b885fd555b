"""The shipped dispatch builder: a `ModelDispatch` over in-process engines, with the pool
discovering them through its `client_factory`, its probes and KV backoffs on a virtual
clock, leases reaching the leased engine, and everything closed on exit."""

from __future__ import annotations

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2

from homing.clock import ManualClock
from homing.engines.breaker import BreakerConfig
from homing.engines.client import EngineError, GenerateDone, GenerateParams
from homing.engines.lifecycle import Phase
from homing.engines.testing import Chunk, Done, Fail, FakeEngine
from homing.fleet.dispatch import NoReplica
from homing.fleet.testing import dispatch_over

REFUSED = EngineError(grpc.StatusCode.UNAVAILABLE, "connection refused")


async def test_every_engine_joins_under_its_key_and_is_closed_on_exit() -> None:
    engines = {"a": FakeEngine(context_length=4096), "b": FakeEngine(context_length=4096)}
    async with dispatch_over(engines) as built:
        assert [(w.worker_id, w.phase, w.healthy) for w in built.pool.workers()] == [
            ("a", Phase.READY, True),
            ("b", Phase.READY, True),
        ]
        assert built.dispatch.model_id == "fake-model"
        # SGLang's window: max_req_input_len (4096 - 1 - 5) + 4.
        assert built.dispatch.max_context_length == 4094
        assert built.dispatch.tokenizer.decode([834, 1234]) == " one two"
        assert built.engines == engines
        assert [e.kv_subscriptions for e in engines.values()] == [1, 1]
        assert [e.worker_id for e in engines.values()] == ["a", "b"]
    assert [e.closes for e in engines.values()] == [1, 1]
    assert [e.publish_kv(common_pb2.KvEventBatch()) for e in engines.values()] == [0, 0]


async def test_a_leases_stream_reaches_the_leased_engine_and_closes_its_breaker_trial() -> None:
    clock = ManualClock()
    engines = {"w0": FakeEngine()}
    async with dispatch_over(engines, clock=clock, unhealthy_threshold=10) as built:
        model = built.dispatch
        for _ in range(5):
            model.report_failure("w0", REFUSED)
        clock.advance(1.0)
        w0 = built.pool.state("w0")
        assert w0.breaker == "half_open"
        engines["w0"].script(Chunk((11,)), Chunk((12,)), Done())
        with model.lease([1, 2, 3]) as trial:
            assert w0.in_flight == 1
            with pytest.raises(NoReplica):
                model.lease([4, 5, 6])  # the one trial is out
            stream = trial.client.generate(GenerateParams("t", [1, 2, 3], max_new_tokens=4))
            assert (await anext(stream)).token_ids == (11,)
            assert w0.breaker == "closed"  # at the first answer, mid-stream
            assert isinstance([i async for i in stream][-1], GenerateDone)
        assert w0.in_flight == 0
        assert engines["w0"].params[0].input_ids == [1, 2, 3]


async def test_probes_wait_for_the_virtual_clock() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    async with dispatch_over({"w0": engine}, clock=clock, unhealthy_threshold=3) as built:
        engine.health = "unhealthy"
        await clock.settle()
        assert built.pool.state("w0").healthy and engine.probes == 1  # discovery's own
        for _ in range(3):
            clock.advance(1.0)  # one probe interval
            await clock.settle()
        assert not built.pool.state("w0").healthy and engine.probes == 4
        with pytest.raises(NoReplica):
            built.dispatch.lease([1, 2, 3])


async def test_an_unreachable_engine_stays_joining_until_it_answers() -> None:
    clock = ManualClock()
    up, down = FakeEngine(), FakeEngine()
    down.reachable = False
    async with dispatch_over({"w0": up, "w1": down}, clock=clock) as built:
        assert built.pool.state("w1").phase is Phase.JOINING
        down.reachable = True
        clock.advance(1.0)
        await clock.settle()
        assert built.pool.state("w1").phase is Phase.READY
        assert down.kv_subscriptions >= 1


async def test_an_engine_of_another_model_is_refused() -> None:
    engines = {"w0": FakeEngine(model="m"), "w1": FakeEngine(model="other")}
    async with dispatch_over(engines) as built:
        assert [w.worker_id for w in built.pool.workers()] == ["w0"]
        assert not built.pool.has("w1")


async def test_a_published_load_record_reaches_the_pools_view() -> None:
    clock = ManualClock()
    engine = FakeEngine()
    async with dispatch_over({"w0": engine}, clock=clock) as built:
        load = common_pb2.EngineLoad(running_requests=3, waiting_requests=2, load_only=True)
        assert engine.publish_kv(common_pb2.KvEventBatch(load=load)) == 1
        await clock.settle()
        view = built.pool.state("w0").load
        assert view is not None and (view.running, view.waiting) == (3, 2)


async def test_an_engine_added_later_joins_under_the_next_free_name() -> None:
    async with dispatch_over({"w0": FakeEngine(), "w2": FakeEngine()}) as built:
        late = FakeEngine()
        state = await built.add(late)
        assert (state.worker_id, state.phase) == ("w1", Phase.READY)
        assert built.engines["w1"] is late and late.worker_id == "w1"


async def test_a_failed_stream_keeps_its_lease_from_resetting_the_failure_run() -> None:
    """A stream that fails on the transport (a scripted Fail, read through
    `lease.client.generate`) tells the lease, which then earns no success: its other stream's
    completion does not reset the breaker's failure run, as a lease without the failure
    does. (Counting the failure itself is the caller's `report_failure`, as the gateway's.)"""
    engine = FakeEngine()
    breaker = BreakerConfig(consecutive=2)
    async with dispatch_over({"w0": engine}, unhealthy_threshold=10, breaker=breaker) as built:
        model = built.dispatch
        model.report_failure("w0", REFUSED)  # one failure in the run
        engine.script(Fail(grpc.StatusCode.UNAVAILABLE, "reset"))
        with model.lease([1]) as lease:
            failed = lease.client.generate(GenerateParams("x", [1], max_new_tokens=1))
            with pytest.raises(EngineError) as caught:
                await anext(failed)
            assert caught.value.transport
            ok = lease.client.generate(GenerateParams("y", [1], max_new_tokens=1))
            assert isinstance([i async for i in ok][-1], GenerateDone)
        assert [a.request_id for a in engine.aborts] == ["x"]
        model.report_failure("w0", REFUSED)  # the run went on: the second one opens it
        assert built.pool.state("w0").breaker == "open"


async def test_a_completed_lease_resets_the_failure_run() -> None:
    """The contrast: a lease whose stream completes with no failure resets the run."""
    engine = FakeEngine()
    breaker = BreakerConfig(consecutive=2)
    async with dispatch_over({"w0": engine}, unhealthy_threshold=10, breaker=breaker) as built:
        model = built.dispatch
        model.report_failure("w0", REFUSED)
        with model.lease([1]) as lease:
            ok = lease.client.generate(GenerateParams("y", [1], max_new_tokens=1))
            assert isinstance([i async for i in ok][-1], GenerateDone)
        model.report_failure("w0", REFUSED)  # a new run of one
        assert built.pool.state("w0").breaker == "closed"
