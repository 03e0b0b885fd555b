"""The affinity judge's inputs from a live run: KV batches as the wire carries them become
cache changes at the batch's publish time, and the client's records joined with homing's
logged routes become judged requests (the index's view only where the policy consulted it)."""

from __future__ import annotations

import json

from smg_grpc_proto.generated import common_pb2

from homing.bench.affinity import CLEARED, REMOVED, STORED, CacheChange
from homing.bench.kv_trace import (
    changes_from_batches,
    homing_routes,
    request_id,
    routed_requests,
)
from homing.bench.records import RequestRecord
from homing.sim.kv_events import fill_proto_event
from homing.sim.radix_cache import AllBlocksCleared, BlockRemoved, BlockStored, block_hash_chain

BS = 16


def test_a_batchs_events_become_changes_at_its_timestamp() -> None:
    tokens = tuple(range(2 * BS))
    hashes = tuple(block_hash_chain(tokens, BS))
    batch = common_pb2.KvEventBatch(sequence_number=3, timestamp=1_700_000_000.25)
    for i, event in enumerate(
        [BlockStored(hashes, None, tokens, BS), BlockRemoved(hashes[1:]), AllBlocksCleared()]
    ):
        fill_proto_event(batch.events.add(), event, i)
    assert list(changes_from_batches([("w2", batch.SerializeToString())])) == [
        CacheChange(1_700_000_000.25, "w2", STORED, hashes),
        CacheChange(1_700_000_000.25, "w2", REMOVED, hashes[1:]),
        CacheChange(1_700_000_000.25, "w2", CLEARED),
    ]


def test_records_join_their_logged_route_or_fall_back_to_the_send_time() -> None:
    def done(rid: str, route: dict[str, object] | None) -> str:
        doc: dict[str, object] = {"event": "request_done", "request_id": rid}
        if route is not None:
            doc["route"] = route
        return json.dumps(doc)

    lines = [
        '{"event": "worker_phase", "worker": "w0"}',
        done(
            request_id(0),
            {
                "branch": "veto",
                "matched_tokens": 32,
                "best_worker": "w1",
                "best_tokens": 64,
                "at": 100.5,
            },
        ),
        done(
            request_id(1),
            {
                "branch": "round_robin",
                "matched_tokens": 0,
                "best_worker": None,
                "best_tokens": None,
                "at": 101.0,
            },
        ),
        done("someone-else", None),
    ]
    routes = homing_routes(lines)
    assert set(routes) == {request_id(0), request_id(1)}
    prompts = {i: list(range(i, i + 3 * BS + 5)) for i in range(3)}
    records = [
        RequestRecord(index=i, scheduled_s=0.0, sent_prompt_tokens=53, max_tokens=4)
        for i in range(4)
    ]
    for i, rec in enumerate(records[:3]):
        rec.worker, rec.cached_tokens, rec.send_s = f"w{i}", 16 * i, 2.0 + i
    judged = routed_requests(records, prompts, sent_at=90.0, block_size=BS, routes=routes)
    assert [(r.request_id, r.at, r.worker, r.served) for r in judged] == [
        (request_id(0), 100.5, "w0", 0),
        (request_id(1), 101.0, "w1", 16),
        (request_id(2), 94.0, "w2", 32),  # no route logged: sent at 90 + 4 s
    ]  # the record with no worker (no answer) is left out
    assert (judged[0].index_branch, judged[0].index_matched, judged[0].index_best) == (
        "veto",
        32,
        64,
    )
    assert judged[1].index_best is None and judged[1].index_branch is None
    assert judged[2].chain == tuple(block_hash_chain(prompts[2], BS))
    assert judged[2].prompt_len == len(prompts[2])


def test_a_route_whose_worker_did_not_serve_the_request_says_nothing_of_its_index() -> None:
    """Retried elsewhere: the first decision's index view is not judged against w1."""
    prompts = {0: list(range(3 * BS + 1))}
    rec = RequestRecord(index=0, scheduled_s=0.0, sent_prompt_tokens=49, max_tokens=4)
    rec.worker, rec.cached_tokens, rec.send_s = "w1", 0, 1.0
    route = {"worker": "w0", "branch": "exact_hit", "matched_tokens": 48,
             "best_worker": "w0", "best_tokens": 48, "at": 5.0}  # fmt: skip
    (judged,) = routed_requests(
        [rec], prompts, sent_at=0.0, block_size=BS, routes={request_id(0): route}
    )
    assert (judged.at, judged.worker, judged.index_best, judged.index_best_worker) == (
        5.0,
        "w1",
        None,
        None,
    )


def test_missing_batches_are_counted_per_worker_and_load_records_are_not_batches() -> None:
    def batch(seq: int, events: int = 1) -> bytes:
        b = common_pb2.KvEventBatch(sequence_number=seq, timestamp=float(seq))
        for i in range(events):
            fill_proto_event(b.events.add(), AllBlocksCleared(), i)
        return b.SerializeToString()

    gaps: dict[str, int] = {}
    stream = [("w0", batch(1)), ("w0", batch(1, events=0)), ("w0", batch(2)), ("w1", batch(7)),
              ("w0", batch(5)), ("w1", batch(8))]  # fmt: skip
    changes = list(changes_from_batches(stream, gaps))
    assert len(changes) == 5 and gaps == {"w0": 2}


def test_log_lines_that_are_not_json_objects_are_skipped() -> None:
    lines = ['"request_done" but cut off {', '["request_done"]', json.dumps(
        {"event": "request_done", "request_id": "a", "route": {"branch": "ring"}})]  # fmt: skip
    assert homing_routes(lines) == {"a": {"branch": "ring"}}
