"""The shipped engine double keeps the real client's contract: its methods have
`EngineClient`'s and `EngineStream`'s signatures; scripts play in call order (a default echo
otherwise), yielding to the event loop between messages; failures carry their gRPC code and
transport reading, gates hold a stream until opened, every early end records an Abort, and a
`StreamWatcher` is told `answered`, `completed` and `failed` at the same points as the real
stream; closing the engine ends its calls as a closed channel does (checked against the real
client over a simulated worker), and an unreachable engine ends them as a dead worker does;
discovery, probes and the KV-event subscription answer as the simulated worker's."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2

from homing.engines.client import (
    EngineApi,
    EngineClient,
    EngineError,
    EngineStream,
    EngineStreamApi,
    GenerateDone,
    GenerateParams,
    TokenChunk,
)
from homing.engines.testing import (
    AbortRecord,
    Chunk,
    Done,
    Fail,
    FakeEngine,
    FakeStream,
    Gate,
    Hold,
    client_factory,
    per_token,
)
from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker
from homing.text.served import served_tokenizer_zip


class RecordingWatcher:
    """A `StreamWatcher` that keeps its calls in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def answered(self) -> None:
        self.calls.append("answered")

    def completed(self) -> None:
        self.calls.append("completed")

    def failed(self, err: EngineError) -> None:
        self.calls.append(f"failed:{err.code.name}")


def params(
    request_id: str = "r1", prompt: tuple[int, ...] = (5, 6, 7), max_new_tokens: int = 16, **kw: Any
) -> GenerateParams:
    return GenerateParams(request_id, prompt, max_new_tokens, **kw)


async def read_all(stream: EngineStreamApi) -> list[TokenChunk | GenerateDone]:
    return [item async for item in stream]


async def drain(items: AsyncIterator[object]) -> None:
    async for _ in items:
        pass


def test_both_the_real_client_and_the_fake_satisfy_the_engine_protocol() -> None:
    engine = FakeEngine()
    assert isinstance(engine, EngineApi)
    assert isinstance(EngineClient("grpc://127.0.0.1:1", worker_id="w0"), EngineApi)
    assert isinstance(engine.generate(params()), EngineStreamApi)


def protocol_members(protocol: type) -> list[str]:
    """The methods and properties `protocol` declares: its public ones, and the async
    iteration methods."""
    return sorted(
        name
        for name, value in vars(protocol).items()
        if (callable(value) or isinstance(value, property))
        and (not name.startswith("_") or name in ("__aiter__", "__anext__"))
    )


def shape(cls: type, name: str) -> tuple[str, list[tuple[str, Any, Any]]]:
    """What kind of member `cls.name` is (property, coroutine, async generator, plain) and
    its parameters' names, kinds and defaults (annotations aside: the return types differ)."""
    member = inspect.getattr_static(cls, name)
    if isinstance(member, property):
        return "property", []
    if inspect.iscoroutinefunction(member):
        kind = "coroutine"
    elif inspect.isasyncgenfunction(member):
        kind = "async generator"
    else:
        kind = "plain"
    parameters = inspect.signature(member).parameters.values()
    return kind, [(p.name, p.kind, p.default) for p in parameters]


@pytest.mark.parametrize(
    ("protocol", "fake", "real"),
    [(EngineApi, FakeEngine, EngineClient), (EngineStreamApi, FakeStream, EngineStream)],
    ids=["engine", "stream"],
)
def test_the_fakes_methods_have_the_real_clients_signatures(
    protocol: type, fake: type, real: type
) -> None:
    """Every method of the protocol takes the same parameters (names, kinds, defaults) on
    the double as on the real class, and is as async (a runtime_checkable isinstance check
    looks at names only)."""
    names = protocol_members(protocol)
    assert {"sever", "__anext__"} & set(names)  # the walk found the protocol's methods
    assert {name: shape(fake, name) for name in names} == {
        name: shape(real, name) for name in names
    }


async def test_the_default_script_echoes_the_prompt_one_token_per_chunk() -> None:
    engine = FakeEngine(cached_tokens=2)
    items = await read_all(engine.generate(params(prompt=(5, 6, 7))))
    chunks, done = items[:-1], items[-1]
    assert [c.token_ids for c in chunks] == [(5,), (6,), (7,)]
    assert [(c.prompt_tokens, c.completion_tokens, c.cached_tokens) for c in chunks] == [
        (3, 1, 2),
        (3, 2, 2),
        (3, 3, 2),
    ]
    assert isinstance(done, GenerateDone)
    assert (done.finish_reason, done.completion_tokens) == ("stop", 3)
    # SGLang 0.5.x repeats the last chunk's tokens in the complete: nothing new in it.
    assert done.token_ids == (7,) and done.new_tokens(3) == ()


async def test_the_default_echo_stops_at_max_new_tokens_with_length() -> None:
    items = await read_all(FakeEngine().generate(params(prompt=(5, 6, 7), max_new_tokens=2)))
    done = items[-1]
    assert [i.token_ids for i in items[:-1]] == [(5,), (6,)]
    assert isinstance(done, GenerateDone) and done.finish_reason == "length"


async def test_a_non_streamed_call_gets_one_complete_carrying_every_token() -> None:
    engine = FakeEngine()
    engine.script(Chunk((1, 2)), Chunk((3,)), Done("length"))
    stream = engine.generate(params(stream=False))
    [done] = await read_all(stream)
    assert isinstance(done, GenerateDone)
    assert (done.token_ids, done.completion_tokens, stream.messages) == ((1, 2, 3), 3, 1)


async def test_tokens_only_in_the_complete_come_as_its_new_tokens() -> None:
    engine = FakeEngine()
    engine.script(Chunk((1,)), Done("stop", matched_stop=9, tokens=(2, 9)))
    items = await read_all(engine.generate(params()))
    done = items[-1]
    assert isinstance(done, GenerateDone)
    assert (done.new_tokens(1), done.completion_tokens, done.matched_stop) == ((2, 9), 3, 9)


async def test_queued_scripts_play_in_call_order_then_the_default() -> None:
    engine = FakeEngine()
    engine.script(Chunk((1,)), Done())
    engine.script(Chunk((2,)), Done())
    first = engine.generate(params("a"), timeout_s=5.0, traceparent="00-x")
    second = engine.generate(params("b"))
    third = engine.generate(params("c", prompt=(8,)))
    assert [i.token_ids for i in await read_all(second)] == [(2,), (2,)]
    assert [i.token_ids for i in await read_all(first)] == [(1,), (1,)]
    assert [i.token_ids for i in await read_all(third)] == [(8,), (8,)]
    assert [p.request_id for p in engine.params] == ["a", "b", "c"]
    assert (engine.calls[0].timeout_s, engine.calls[0].traceparent) == (5.0, "00-x")
    assert engine.aborts == [] and engine.queued_scripts == 0


async def test_a_failure_before_the_first_token_carries_its_code_and_aborts() -> None:
    engine = FakeEngine().attach("w3")
    engine.script(Fail(grpc.StatusCode.UNAVAILABLE, "gone"))
    watcher = RecordingWatcher()
    stream = engine.generate(params("r9"), watcher=watcher)
    with pytest.raises(EngineError) as caught:
        await anext(stream)
    err = caught.value
    assert (err.code, err.message, err.transport, err.worker_id) == (
        grpc.StatusCode.UNAVAILABLE,
        "gone",
        True,
        "w3",
    )
    assert watcher.calls == ["failed:UNAVAILABLE"]
    assert engine.aborts == [AbortRecord("r9", "rpc error UNAVAILABLE")]
    assert engine.open_streams == 0
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_failure_after_k_tokens_follows_them_and_a_clients_mistake_is_no_transport() -> (
    None
):
    engine = FakeEngine()
    engine.script(*per_token((1, 2)), Fail(grpc.StatusCode.INVALID_ARGUMENT, "bad"))
    watcher = RecordingWatcher()
    stream = engine.generate(params(), watcher=watcher)
    got = [(await anext(stream)).token_ids, (await anext(stream)).token_ids]
    with pytest.raises(EngineError) as caught:
        await anext(stream)
    assert got == [(1,), (2,)]
    assert (caught.value.code, caught.value.transport) == (grpc.StatusCode.INVALID_ARGUMENT, False)
    assert watcher.calls == ["answered", "failed:INVALID_ARGUMENT"]


async def test_a_completed_stream_tells_the_watcher_answered_then_completed_once() -> None:
    engine = FakeEngine()
    engine.script(Chunk(()), Chunk((4,)), Chunk((5,)), Done())
    watcher = RecordingWatcher()
    stream = engine.generate(params(), watcher=watcher)
    await anext(stream)  # an empty chunk is no answer
    assert watcher.calls == []
    await read_all(stream)
    assert watcher.calls == ["answered", "completed"]
    await stream.aclose()  # after the complete: no Abort
    assert engine.aborts == [] and stream.completed


async def test_an_aborted_complete_is_no_answer_and_no_completion() -> None:
    engine = FakeEngine()
    engine.script(Chunk(()), Done("abort"))
    watcher = RecordingWatcher()
    items = await read_all(engine.generate(params(), watcher=watcher))
    assert isinstance(items[-1], GenerateDone) and items[-1].finish_reason == "abort"
    assert watcher.calls == []


async def test_a_script_that_runs_out_without_a_complete_is_an_internal_transport_error() -> None:
    engine = FakeEngine()
    engine.script(Chunk((1,)))
    watcher = RecordingWatcher()
    stream = engine.generate(params("cut"), watcher=watcher)
    await anext(stream)
    with pytest.raises(EngineError) as caught:
        await anext(stream)
    assert (caught.value.code, caught.value.transport) == (grpc.StatusCode.INTERNAL, True)
    assert watcher.calls == ["answered", "failed:INTERNAL"]
    assert engine.aborts == [AbortRecord("cut", "stream ended without complete")]


async def test_a_gate_holds_the_stream_until_the_test_opens_it() -> None:
    engine = FakeEngine()
    gate = Gate("mid")
    engine.script(Chunk((1,)), Hold(gate), Chunk((2,)), Done())
    stream = engine.generate(params())
    assert (await anext(stream)).token_ids == (1,)
    pending = asyncio.create_task(anext(stream))
    await gate.reached()
    assert (gate.waiting, gate.arrivals, pending.done()) == (1, 1, False)
    gate.open()
    assert (await pending).token_ids == (2,)
    assert gate.waiting == 0
    # An open gate lets later streams through at once.
    engine.script(Hold(gate), Done())
    assert len(await read_all(engine.generate(params("later")))) == 1
    assert gate.arrivals == 2


async def test_sever_fails_a_held_read_at_once_with_unavailable_and_aborts() -> None:
    engine = FakeEngine().attach("w0")
    gate = Gate()
    engine.script(Chunk((1,)), Hold(gate), Done())
    watcher = RecordingWatcher()
    stream = engine.generate(params("held"), watcher=watcher)
    await anext(stream)
    pending = asyncio.create_task(anext(stream))
    await gate.reached()
    assert engine.open_streams == 1
    assert engine.sever("stopped answering") == 1
    with pytest.raises(EngineError) as caught:
        await pending
    assert (caught.value.code, caught.value.transport, caught.value.message) == (
        grpc.StatusCode.UNAVAILABLE,
        True,
        "stopped answering",
    )
    assert watcher.calls == ["answered", "failed:UNAVAILABLE"]
    assert engine.aborts == [AbortRecord("held", "severed: stopped answering")]
    assert engine.open_streams == 0 and engine.sever("again") == 0


async def test_a_severed_stream_not_being_read_fails_its_next_read() -> None:
    engine = FakeEngine()
    stream = engine.generate(params())
    assert stream.sever(EngineError(grpc.StatusCode.UNAVAILABLE, "cut", transport=True))
    assert engine.open_streams == 1  # until its reader learns of it, as the real stream
    with pytest.raises(EngineError):
        await anext(stream)
    assert engine.open_streams == 0


async def test_closing_a_stream_before_its_complete_aborts_once() -> None:
    engine = FakeEngine()
    stream = engine.generate(params("left"))
    await anext(stream)
    await stream.aclose()
    await stream.aclose()
    assert engine.aborts == [AbortRecord("left", "client closed the stream")]
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_a_reader_cancelled_at_a_gate_aborts_its_request() -> None:
    engine = FakeEngine()
    gate = Gate()
    engine.script(Hold(gate), Done())
    stream = engine.generate(params("gone"))
    pending = asyncio.create_task(anext(stream))
    await gate.reached()
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert engine.aborts == [AbortRecord("gone", "cancelled")]
    assert gate.waiting == 0 and engine.open_streams == 0


async def test_closing_from_elsewhere_ends_a_held_read() -> None:
    engine = FakeEngine()
    gate = Gate()
    engine.script(Hold(gate), Done())
    stream = engine.generate(params("closed"))
    pending = asyncio.create_task(anext(stream))
    await gate.reached()
    await stream.aclose()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert engine.aborts == [AbortRecord("closed", "client closed the stream")]


async def test_streams_read_side_by_side_take_turns_between_messages() -> None:
    """Each read yields to the event loop first, so two readers interleave chunk by chunk."""
    engine = FakeEngine()
    seen: list[tuple[str, int]] = []

    async def read(name: str) -> None:
        async for item in engine.generate(params(name, prompt=(1, 2, 3))):
            if isinstance(item, TokenChunk):
                seen.append((name, item.token_ids[0]))

    await asyncio.gather(read("a"), read("b"))
    assert seen == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]


async def test_a_reader_cancelled_between_chunks_aborts_its_request() -> None:
    """A cancellation that lands between two messages ends the stream there."""
    engine = FakeEngine()
    stream = engine.generate(params("mid", prompt=(1, 2, 3)))
    await anext(stream)
    reader = asyncio.create_task(read_all(stream))
    await asyncio.sleep(0)  # the reader runs up to its next yield
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert engine.aborts == [AbortRecord("mid", "cancelled")] and not stream.completed


async def test_closing_the_engine_ends_its_calls_as_a_closed_channel_does() -> None:
    """`close` cancels every open call, as grpc.aio cancels a closed channel's: a held read,
    a stream not being read and a KV subscription each raise CancelledError (an Abort each,
    no watcher `failed`); the engine answers new calls afterwards."""
    engine = FakeEngine()
    gate = Gate()
    engine.script(Chunk((1,)), Hold(gate), Done())
    watcher = RecordingWatcher()
    held = engine.generate(params("held"), watcher=watcher)
    await anext(held)
    pending = asyncio.create_task(anext(held))
    await gate.reached()
    idle = engine.generate(params("idle"))
    subscription = engine.subscribe_kv_events()
    kv_read = asyncio.create_task(anext(subscription))
    await engine.kv_subscribed()
    await engine.close()
    reads: list[Awaitable[object]] = [pending, anext(idle), kv_read]
    for read in reads:
        with pytest.raises(asyncio.CancelledError):
            await read
    assert watcher.calls == ["answered"]
    assert engine.aborts == [AbortRecord("held", "cancelled"), AbortRecord("idle", "cancelled")]
    assert (engine.open_streams, engine.closes, gate.waiting) == (0, 1, 0)
    with pytest.raises(StopAsyncIteration):
        await anext(held)
    assert len(await read_all(engine.generate(params("after")))) == 4


async def closed_mid_call(engine: EngineApi, long: GenerateParams) -> list[str]:
    """What a Generate stream's reader and a KV subscription's get when `engine` is closed
    while they read, and what the stream's next read gets (exception names)."""

    async def outcome(read: Awaitable[object]) -> str:
        try:
            await read
        except BaseException as exc:  # the outcome is the point
            return type(exc).__name__
        return "no error"

    stream = engine.generate(long)
    await anext(stream)
    reader = asyncio.create_task(outcome(drain(stream)))
    kv_reader = asyncio.create_task(outcome(drain(engine.subscribe_kv_events())))
    await asyncio.sleep(0.2)
    await engine.close()
    return [await reader, await kv_reader, await outcome(anext(stream))]


async def test_a_closed_channel_ends_the_real_clients_calls_as_the_fakes() -> None:
    """The behaviour `FakeEngine.close` copies, measured on `EngineClient` over a simulated
    worker: the reader gets CancelledError (grpc.aio's for a locally cancelled call, which
    `EngineStream` lets through), not an `EngineError`."""
    long = params("long", prompt=tuple(range(1000, 1064)), max_new_tokens=4000)
    async with asyncio.timeout(60), SimWorker(SimConfig(), sidecar=False) as worker:
        real = await closed_mid_call(EngineClient(worker.url, worker_id="w0"), long)
    fake = FakeEngine()
    fake.script(Chunk((1,)), Hold(Gate()), Done())
    assert real == await closed_mid_call(fake, long)
    assert real == ["CancelledError", "CancelledError", "StopAsyncIteration"]


async def test_an_engine_going_unreachable_fails_its_open_calls_with_unavailable() -> None:
    """`reachable = False` ends open calls as a dead worker does: a held read, a stream not
    being read and a KV subscription each raise UNAVAILABLE (transport), each stream with
    its Abort and its watcher told."""
    engine = FakeEngine().attach("w1")
    gate = Gate()
    engine.script(Chunk((1,)), Hold(gate), Done())
    watcher = RecordingWatcher()
    held = engine.generate(params("held"), watcher=watcher)
    await anext(held)
    pending = asyncio.create_task(anext(held))
    await gate.reached()
    idle = engine.generate(params("idle"))
    subscription = engine.subscribe_kv_events()
    kv_read = asyncio.create_task(anext(subscription))
    await engine.kv_subscribed()
    engine.reachable = False
    reads: list[Awaitable[object]] = [pending, anext(idle), kv_read]
    for read in reads:
        with pytest.raises(EngineError) as caught:
            await read
        err = caught.value
        assert (err.code, err.transport, err.worker_id) == (grpc.StatusCode.UNAVAILABLE, True, "w1")
    assert watcher.calls == ["answered", "failed:UNAVAILABLE"]
    assert engine.aborts == [
        AbortRecord("held", "rpc error UNAVAILABLE"),
        AbortRecord("idle", "rpc error UNAVAILABLE"),
    ]
    assert engine.open_streams == 0 and gate.waiting == 0


async def test_generated_waits_for_the_calls() -> None:
    engine = FakeEngine()
    waiting = asyncio.create_task(engine.generated(2))
    engine.generate(params("a"))
    await asyncio.sleep(0)
    assert not waiting.done()
    engine.generate(params("b"))
    await waiting


def test_params_the_real_client_refuses_are_refused() -> None:
    bad = params(return_logprob=True, logprob_start_len=-2)
    with pytest.raises(ValueError):
        FakeEngine().generate(bad)


async def test_probes_answer_as_told() -> None:
    engine = FakeEngine()
    assert (await engine.health_probe()).healthy and await engine.health_check()
    engine.health = "unhealthy"
    probe = await engine.health_probe()
    assert (probe.healthy, probe.timed_out) == (False, False)
    engine.health = "timeout"
    probe = await engine.health_probe()
    assert (probe.healthy, probe.timed_out) == (False, True)
    assert engine.probes == 4


async def test_an_unreachable_engine_refuses_every_call_with_unavailable() -> None:
    engine = FakeEngine()
    engine.script(Done())
    engine.reachable = False
    probe = await engine.health_probe()
    assert (probe.healthy, probe.timed_out) == (False, False)
    for call in (engine.model_info, engine.server_info, engine.tokenizer_bundle):
        with pytest.raises(EngineError) as caught:
            await call()
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(EngineError):
        await read_all(engine.generate(params()))
    with pytest.raises(EngineError):
        await anext(engine.subscribe_kv_events())
    assert engine.queued_scripts == 1  # kept for when it is back


async def test_discovery_answers_as_the_simulated_worker() -> None:
    engine = FakeEngine(model="m", context_length=4096, page_size=32, eos_token_ids=(1, 2))
    info = await engine.model_info()
    assert (info.served_model_name, info.max_context_length, info.max_req_input_len) == (
        "m",
        4096,
        4090,
    )
    assert list(info.eos_token_ids) == [1, 2]
    server = await engine.server_info()
    assert server.server_args.fields["page_size"].number_value == 32
    assert await engine.tokenizer_bundle() == served_tokenizer_zip()


async def test_a_kv_subscription_carries_published_batches_until_ended() -> None:
    engine = FakeEngine()
    subscription = engine.subscribe_kv_events()
    first = asyncio.create_task(anext(subscription))
    await engine.kv_subscribed()
    batch = common_pb2.KvEventBatch(sequence_number=4)
    assert engine.publish_kv(batch) == 1
    assert common_pb2.KvEventBatch.FromString(await first).sequence_number == 4
    assert engine.end_kv_streams() == 1
    with pytest.raises(StopAsyncIteration):
        await anext(subscription)
    assert engine.publish_kv(batch) == 0


async def test_a_kv_subscription_can_end_with_a_status() -> None:
    engine = FakeEngine()
    subscription = engine.subscribe_kv_events()
    pending = asyncio.create_task(anext(subscription))
    await engine.kv_subscribed()
    engine.end_kv_streams(grpc.StatusCode.DATA_LOSS, "overflow")
    with pytest.raises(EngineError) as caught:
        await pending
    assert caught.value.code == grpc.StatusCode.DATA_LOSS


async def test_a_kv_subscription_from_a_later_sequence_is_out_of_range() -> None:
    with pytest.raises(EngineError) as caught:
        await anext(FakeEngine().subscribe_kv_events(start_sequence_number=3))
    assert caught.value.code == grpc.StatusCode.OUT_OF_RANGE


def test_the_client_factory_attaches_each_engine_under_the_pools_worker_id() -> None:
    """Engines known at the start or added later; those handed out are kept by worker id."""
    a, b = FakeEngine(), FakeEngine()
    make = client_factory([a, b])
    assert make(b.url, "w7") is b and b.worker_id == "w7"
    assert a.url != b.url
    with pytest.raises(KeyError):
        make("grpc://elsewhere:1", "w8")
    late = FakeEngine()
    make.add(late)
    assert make(late.url, "w9") is late
    assert make.engines == {"w7": b, "w9": late}
