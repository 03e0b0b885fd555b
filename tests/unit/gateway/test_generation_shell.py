"""`Generation`, the request shell, over in-process engines on a virtual clock: it carries out
the rules of `homing.gateway.failover` (a retryable failure before the first byte goes to
another replica, one after it migrates the stream with the tokens produced so far, a client's
mistake fails at once), and it stops reading an engine stream while its consumer is behind.

The router's `round_robin` policy sends the first request to the first worker id ("w0"), so
a script on w0 plays on the first attempt."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest

from homing.clock import ManualClock
from homing.engines.testing import Chunk, Done, Fail, FakeEngine, Gate, Hold, per_token
from homing.fleet.testing import BuiltDispatch, dispatch_over
from homing.gateway import failover
from homing.gateway.errors import APIError
from homing.gateway.generation import (
    MAX_PENDING_EVENTS,
    ChoiceFinished,
    Event,
    TextDelta,
)
from homing.gateway.testing import RecordingHost, prepared_request
from homing.obs.requests import RequestDone

MODEL = "fake-model"


def encode(built: BuiltDispatch, text: str) -> list[int]:
    return built.dispatch.tokenizer.encode_plain(text)


def texts(events: Sequence[Event]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextDelta)]


def finishes(events: Sequence[Event]) -> list[tuple[int, str]]:
    return [(e.index, e.reason) for e in events if isinstance(e, ChoiceFinished)]


async def test_unavailable_before_the_first_token_is_retried_on_the_other_replica() -> None:
    clock = ManualClock()
    w0, w1 = FakeEngine(), FakeEngine()
    w0.script(Fail(grpc.StatusCode.UNAVAILABLE, "connection reset"))
    async with dispatch_over({"w0": w0, "w1": w1}, clock=clock, policy="round_robin") as built:
        prompt = encode(built, " one two three four")
        host = RecordingHost(clock=clock)
        generation = host.open(prepared_request(built.dispatch, prompt, clock=clock))
        async with generation:
            events = [event async for event in generation]
        # One clean stream: w1's echo of the prompt, nothing of the failed attempt.
        assert texts(events) == [" one", " two", " three", " four"]
        assert finishes(events) == [(0, "stop")]
        assert (generation.worker_id, generation.outcome) == ("w1", "ok")
        assert w0.params[0].input_ids == w1.params[0].input_ids == prompt
        assert host.retries == {(MODEL, "retried"): 1}
        # A transport failure: reported to w0's health, and its engine request aborted.
        assert failover.classify("UNAVAILABLE", transport=True).reported
        assert built.pool.state("w0").consecutive_failures == 1
        assert [a.request_id for a in w0.aborts] == [w0.params[0].request_id]
        assert w1.aborts == [] and host.in_flight == 0


async def test_a_stream_failing_after_k_tokens_migrates_with_them_and_repeats_none() -> None:
    clock = ManualClock()
    w0, w1 = FakeEngine(), FakeEngine()
    async with dispatch_over({"w0": w0, "w1": w1}, clock=clock, policy="round_robin") as built:
        prompt = encode(built, "Count to four:")
        one, two, three, four = encode(built, " one two three four")
        failing = Gate("after two tokens")
        w0.script(*per_token((one, two)), Hold(failing), Fail(grpc.StatusCode.UNAVAILABLE))
        w1.script(*per_token((three, four)), Done("stop"))
        host = RecordingHost(clock=clock, migrate_streams=True)
        prepared = prepared_request(built.dispatch, prompt, clock=clock, max_new_tokens=6)
        generation = host.open(prepared)
        events: list[Event] = []
        async with generation:
            async for event in generation:
                events.append(event)
                if len(texts(events)) == 2:
                    failing.open()  # the client has both tokens: w0 fails now
        assert failing.arrivals == 1
        resumed = w1.params[0]
        assert list(resumed.input_ids) == [*prompt, one, two]
        assert resumed.max_new_tokens == 6 - 2
        assert texts(events) == [" one", " two", " three", " four"]
        assert finishes(events) == [(0, "stop")]
        assert host.migrations == {(MODEL, "migrated"): 1} and host.retries == {}
        usage = generation.usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), 4)
        assert generation.outcome == "ok"


async def test_a_clients_mistake_from_the_worker_fails_at_once_as_failover_says() -> None:
    clock = ManualClock()
    w0, w1 = FakeEngine(), FakeEngine()
    w0.script(Fail(grpc.StatusCode.INVALID_ARGUMENT, "prompt too long"))
    reading = failover.classify("INVALID_ARGUMENT", transport=False)
    assert not reading.retryable and not reading.reported
    async with dispatch_over({"w0": w0, "w1": w1}, clock=clock, policy="round_robin") as built:
        host = RecordingHost(clock=clock)
        generation = host.open(prepared_request(built.dispatch, [1, 2, 3], clock=clock))
        with pytest.raises(APIError) as caught:
            async with generation:
                pass
        assert caught.value.status == 400
        assert generation.outcome == "error_400"
        assert w1.calls == [] and host.retries == {}  # not retried
        w0_state = built.pool.state("w0")
        assert (w0_state.consecutive_failures, w0_state.breaker) == (0, "closed")
        assert host.in_flight == 0


async def test_a_slow_consumer_holds_the_engine_stream_at_the_shells_bound() -> None:
    clock = ManualClock()
    w0 = FakeEngine()
    async with dispatch_over({"w0": w0}, clock=clock) as built:
        [a] = encode(built, " a")
        total = 3 * MAX_PENDING_EVENTS
        w0.script(*per_token([a] * total), Done("length"))
        host = RecordingHost(clock=clock)
        prepared = prepared_request(built.dispatch, [1, 2, 3], clock=clock, max_new_tokens=total)
        generation = host.open(prepared)
        async with generation:  # takes the first event, then the consumer reads nothing
            stream = w0.calls[0].stream
            read = -1
            for _ in range(1000):  # the engine yields a loop round per message
                if stream.messages == read:
                    break
                read = stream.messages
                await clock.settle()
            # The queue's bound, the event the shell took on entering, the one in hand.
            assert MAX_PENDING_EVENTS <= read <= MAX_PENDING_EVENTS + 2
            await clock.settle(100)
            assert stream.messages == read  # it waits for the consumer, not the worker
            events = [event async for event in generation]
        assert "".join(texts(events)) == " a" * total
        assert finishes(events) == [(0, "length")]
        assert stream.messages == total + 1 and stream.completed


async def test_a_client_leaving_mid_stream_aborts_the_engine_request() -> None:
    clock = ManualClock()
    w0 = FakeEngine()
    held = Gate()
    async with dispatch_over({"w0": w0}, clock=clock) as built:
        w0.script(Chunk(tuple(encode(built, " hi"))), Hold(held), Done())
        host = RecordingHost(clock=clock)
        generation = host.open(prepared_request(built.dispatch, [5, 6], clock=clock))
        async with generation:  # its first event came: the client leaves at the gate
            await held.reached()
        assert generation.outcome == "client_closed"
        assert [a.reason for a in w0.aborts] == ["cancelled"]
        assert built.pool.state("w0").in_flight == 0 and host.in_flight == 0


async def test_the_request_record_carries_the_first_routing_decision() -> None:
    """The log's `route` object: the chosen worker, the branch, the prefix the index
    credited to it and to its best holder, and the decision's wall time, of the first
    decision (w0), not of the retry that served the request (w1)."""
    clock = ManualClock()
    w0, w1 = FakeEngine(), FakeEngine()
    w0.script(Fail(grpc.StatusCode.UNAVAILABLE, "connection reset"))
    async with dispatch_over({"w0": w0, "w1": w1}, clock=clock, policy="round_robin") as built:
        prompt = encode(built, " one two three four")
        host = RecordingHost(clock=clock)
        done: list[RequestDone] = []
        host.recorder.on_done.append(lambda record, _verdict: done.append(record))
        clock.advance(2.5)
        generation = host.open(prepared_request(built.dispatch, prompt, clock=clock))
        async with generation:
            _ = [event async for event in generation]
        assert generation.worker_id == "w1"
        (record,) = done
        assert record.fields["route"] == {
            "worker": "w0",  # the first decision's, not the retry's
            "branch": "round_robin",
            "matched_tokens": 0,
            "best_worker": None,  # round robin does not consult the index
            "best_tokens": None,
            "at": round(clock.wall(), 6),
        }
