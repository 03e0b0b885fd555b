"""The shipped `RecordingObserver` keeps its contract: it has the `RouterObserver` methods with
the protocol's signatures, and a real `Router` driving it leaves every report in call order."""

from __future__ import annotations

import inspect

import pytest

from homing.clock import ManualClock
from homing.router import RouteDecision, Router, RouteRequest, RouterObserver, WorkerSnapshot
from homing.router.events import BatchCounts, BlocksStored, CacheCleared, StoredBlock
from homing.router.testing import FlushRecord, KvBatchRecord, RecordingObserver

PROMPT = list(range(100, 132))  # two 16-token blocks


def protocol_methods() -> list[str]:
    return [
        name
        for name, member in vars(RouterObserver).items()
        if inspect.isfunction(member) and not name.startswith("_")
    ]


def test_it_has_every_observer_method_with_the_protocols_signature() -> None:
    """Each method the protocol declares exists on the double with the same parameters and
    annotations (a method added to the protocol fails here until the double has it)."""
    names = protocol_methods()
    assert set(names) >= {"on_decision", "on_kv_batch", "on_flush"}
    for name in names:
        want = inspect.signature(getattr(RouterObserver, name))
        got = inspect.signature(getattr(RecordingObserver, name))
        assert got == want, name


def test_a_router_reports_decisions_batches_and_flushes_in_order() -> None:
    """Stored blocks (an exact_mode flush), two selections, a cleared cache, a flush by the
    pool and a removal: each lands in its list, in the order the router reported it."""
    observer = RecordingObserver()
    router = Router(clock=ManualClock(1.0), observer=observer)
    blocks = tuple(
        StoredBlock(engine_hash=10 + i, token_ids=tuple(PROMPT[16 * i : 16 * (i + 1)]))
        for i in range(2)
    )
    router.apply_events("w0", [BlocksStored(blocks=blocks)], lag_s=0.25)
    workers = [WorkerSnapshot("w0"), WorkerSnapshot("w1")]
    first = router.select(RouteRequest([*PROMPT, 1]), workers)
    second = router.select(RouteRequest([*PROMPT, 2]), workers)
    router.apply_events("w0", [CacheCleared()])
    router.flush_worker("w1", "gap")
    router.remove_worker("w1")

    assert observer.decisions == [first, second]
    assert first.worker_id == "w0" and first.matched_tokens == 32
    assert observer.extras == []
    assert observer.batches == [
        KvBatchRecord("w0", BatchCounts(stored=2), 0.25),
        KvBatchRecord("w0", BatchCounts(cleared=1), None),
    ]
    assert observer.flushes == [
        FlushRecord("w0", "exact_mode"),
        FlushRecord("w0", "cleared"),
        FlushRecord("w1", "gap"),
        FlushRecord("w1", "removed"),
    ]
    assert observer.batches[0] == ("w0", BatchCounts(stored=2), 0.25)  # plain tuples compare
    assert observer.batch_counts("w0") == [BatchCounts(stored=2), BatchCounts(cleared=1)]
    assert observer.batch_counts("w1") == []
    assert observer.flush_reasons() == ["exact_mode", "cleared", "gap", "removed"]
    assert observer.flush_reasons("w1") == ["gap", "removed"]


def test_the_extra_hook_runs_at_each_decision_and_pairs_with_it() -> None:
    """The hook sees each decision as the router makes it, and reads state of that moment
    (here: how many decisions the router had counted when it reported this one)."""
    router = Router(policy="round_robin", clock=ManualClock(0.0))

    def counted(decision: RouteDecision) -> tuple[str, int]:
        return decision.worker_id, sum(router.decisions.values())

    observer = RecordingObserver(counted)
    router.observer = observer
    workers = [WorkerSnapshot("w0"), WorkerSnapshot("w1")]
    chosen = [router.select(RouteRequest([i]), workers).worker_id for i in range(3)]

    assert observer.extras == [(w, i + 1) for i, w in enumerate(chosen)]
    assert observer.decisions_with_extras() == list(
        zip(observer.decisions, observer.extras, strict=True)
    )
    assert [d.worker_id for d, _ in observer.decisions_with_extras()] == chosen


def test_a_failing_hook_records_nothing_and_reaches_the_caller() -> None:
    """An exception from the hook propagates out of `select`; the lists stay paired."""

    def broken(decision: RouteDecision) -> int:
        raise KeyError(decision.worker_id)

    observer = RecordingObserver(broken)
    router = Router(observer=observer)
    with pytest.raises(KeyError):
        router.select(RouteRequest([1, 2, 3]), [WorkerSnapshot("w0")])
    assert observer.decisions == [] and observer.extras == []


def test_without_a_hook_there_are_no_extras_to_pair() -> None:
    with pytest.raises(ValueError, match="no extra hook"):
        RecordingObserver().decisions_with_extras()
