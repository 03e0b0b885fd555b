"""The shapes of SGLang's gRPC protocol (`sglang.grpc.scheduler.SglangScheduler`, smg-grpc-proto
0.4.28), recorded from a real SGLang 0.5.23 worker (smg-grpc-servicer 0.14.1) and compared with
the live real worker and with homing's simulator.

A shape is what a gateway depends on, never a token value: which oneof and fields each message
sets, how many messages of each kind come for a request of `max_new_tokens`, how the `complete`'s
`output_ids` relate to the chunks, which KV events a cache-filling request publishes and how they
chain, which sections GetLoads fills. `record_shapes` runs one fixed sequence of requests against
a worker and reduces what comes back to a nested dict of such facts.

- `recorded/sglang-0.5.23.json` holds the real worker's shapes. `HOMING_RECORD_PROTOCOL=1` makes
  the real-worker test write it (then commit it); otherwise the test reads it, and a real worker
  whose shapes differ fails with one line per differing fact: a new SGLang release that changes
  the protocol shows up here first.
- The simulator (in this process, configured like the real worker: page 16, a 65,536-token pool,
  a 4,096-token context) is compared with the same file, except for `SIM_DIFFERENCES` (each with
  its reason; an entry that no longer differs fails, so the list stays true) and
  `SIM_TOLERATED` (facts the simulator may or may not match from run to run).
- The real worker is the protocol suite's (`sglang_fleet`: `homing worker` with the tiny
  random-weight Llama on the CPU, page 16, a 65,536-token pool), its cache flushed first; its
  tests skip (with the reason) where `.venv-sglang` or the model is missing.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
import zipfile
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from engine_fleet import Fleet
from kv_subscription import KvSubscription
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.engines.client import (
    EngineClient,
    GenerateDone,
    GenerateParams,
    TokenChunk,
    build_generate_request,
    grpc_target,
)
from homing.sim.config import SimConfig
from homing.sim.radix_cache import block_hash_chain
from homing.sim.worker import SimWorker
from homing.text.tokenizer import TextTokenizer

RECORDED = Path(__file__).parent / "recorded" / "sglang-0.5.23.json"
RECORD_ENV = "HOMING_RECORD_PROTOCOL"

PAGE_SIZE = 16
"""KV page size of both workers (tokens): `--page-size 16`, SimConfig.page_size."""
KV_POOL_TOKENS = 65536
"""KV pool of both workers (tokens): `--max-total-tokens 65536`, SimConfig.kv_capacity_tokens."""
CONTEXT_TOKENS = 4096
"""The tiny model's context (its config's max_position_embeddings); the simulator gets the same."""

PROMPT = tuple(range(1000, 1040))
"""40 prompt ids: two full pages and 8 tokens of a third."""
EXTENSION = (*PROMPT, *range(1040, 1064))
"""PROMPT and 24 more ids: 64 tokens, whose pages 2 and 3 extend PROMPT's chain."""
MAX_NEW = 8
"""Completion budget of the plain Generate cases (tokens)."""

WAIT_S = 15.0
"""Deadline for an expected event (a KV batch, a load change) on either worker."""
ABORT_QUIET_S = 1.5
"""How long a stream is watched after Abort for a message (or its end) before it counts as
open: neither SGLang 0.5.23 nor the simulator ever ends it."""

SIM_DIFFERENCES: dict[str, str] = {
    # ---- differences the simulator should lose (see docs/protocol-fidelity.md) ----
    "kv_events.event_batch_load_fields": "the simulator adds active_token_usage and "
    "prefill_pending_tokens to every load record, which smg-grpc-servicer 0.14.1 never sets",
    "kv_events.load_only_fields": "SGLang's heartbeats carry the disaggregation section and no "
    "active_token_usage / prefill_pending_tokens; the simulator's the reverse",
    "abort.duplicate_request_id": "SGLang accepts a second request with an id in flight and "
    "cross-wires their outputs; the simulator refuses it (INVALID_ARGUMENT)",
    "health.health_check_reaches_engine": "SGLang's HealthCheck runs a one-token generation "
    "inside the engine; the simulator answers without one",
    # ---- intended differences ----
    "kv_events.first_batch": "the simulator honours load_records_before_first_batch, as the "
    "proto defines it (a load_only record numbered 0 at once), which homing's tests rely on: "
    "the pool has a load view and an open stream before any cache event; smg-grpc-servicer "
    "0.14.1 ignores the flag and sends nothing before the first cache event",
    "generate.stream_n2": "homing always sends n = 1 (n > 1 fans out in the gateway); the "
    "simulator refuses n > 1",
    "generate.nonstream_n2": "as generate.stream_n2",
    "model_info.served_model_name": "the real worker here runs without --served-model-name; the "
    "simulator always has a model name",
    "model_info.fields_set": "the simulator also sets served_model_name (as "
    "model_info.served_model_name)",
    "server_info.sglang_version": "the simulator reports 'homing-sim'",
    "server_info.scheduler_info_keys": "SGLang's scheduler_info carries its startup report; the "
    "simulator carries the limits only (homing reads none of them)",
    "server_info.server_args.chunked_prefill_size": "SGLang leaves it null unless set; the "
    "simulator reports its number",
    "server_info.server_args.context_length": "SGLang leaves it null unless set; the simulator "
    "reports its window",
    "loads.version": "the simulator reports 'homing-sim'",
    "loads.sections_all": "SGLang adds the disaggregation section (mode 'null')",
    "loads.sections_default_include": "as loads.sections_all",
    "tokenizer.chunk_bytes": "the simulator streams 512 KiB chunks, SGLang 64 KiB",
    "tokenizer.files": "SGLang's bundle also carries config.json and generation_config.json",
    "generate.nonstream_json_schema.index_0.complete_0.completion_tokens": "the tokens a "
    "constrained answer takes are the model's choice: the real model spells the JSON in pieces "
    "it draws, the simulator as the tokenizer encodes its instance (fewer)",
}
"""Paths (a path covers its subtree) where the simulator differs from the recording, and why."""

MERGED_STEPS = (
    "a simulator handler that falls behind sends the steps it missed as one chunk (as a busy "
    "SGLang tokenizer manager would); SGLang 0.5.23's servicer sent one chunk per step in every "
    "recorded run"
)
SIM_TOLERATED: dict[str, tuple[Callable[[object, object], bool], str]] = {
    "chunking": (lambda recorded, sim: sim == "merged steps", MERGED_STEPS),
    "chunks": (
        lambda recorded, sim: isinstance(sim, int) and isinstance(recorded, int) and sim < recorded,
        MERGED_STEPS,
    ),
    "stream_after_abort": (
        lambda recorded, sim: (
            isinstance(sim, str)
            and sim.startswith("open; after it: ['chunk'")
            and sim.endswith("]; finish_reason: []")
            and "complete" not in sim
        ),
        "chunks the simulator sent before the Abort reached it (it decodes a token every few "
        "milliseconds, the CPU worker far slower) may be read after it; still no complete and "
        "the stream stays open",
    ),
}
"""Leaf names where the simulator may differ from the recording when the predicate (recorded
value, simulator value) holds, and why."""


# ------------------------------------------------------------------------------- shapes


def _fields(message: Any) -> list[str]:
    """Names of the fields `message` sets (proto3: a plain scalar counts when non-zero)."""
    return sorted(field.name for field, _ in message.ListFields())


def _optional_fields(message: Any) -> list[str]:
    """Names of the explicit-presence fields (optional scalars, messages) `message` sets."""
    return sorted(field.name for field, _ in message.ListFields() if field.has_presence)


def _chunking(chunks: list[pb.GenerateStreamChunk]) -> str:
    """How a stream's chunks split its tokens."""
    sizes = [len(c.token_ids) for c in chunks]
    if not sizes:
        return "no chunks"
    if sizes == [0]:
        return "one empty chunk"
    if all(s == 1 for s in sizes):
        return "one token each"
    if all(s == 1 for s in sizes[:-1]) and sizes[-1] == 0:
        return "one token each, then an empty chunk"
    return "merged steps"


def _output_ids_relation(output_ids: list[int], chunks: list[pb.GenerateStreamChunk]) -> str:
    """How a complete's output_ids relate to the chunks of its stream."""
    streamed = [t for c in chunks for t in c.token_ids]
    if not output_ids:
        return "empty"
    if chunks and output_ids == list(chunks[-1].token_ids):
        return "the last chunk's tokens"
    if chunks and output_ids == streamed:
        return "every streamed token"
    if not chunks:
        return "every token"
    return "other"


def generate_shape(
    responses: list[pb.GenerateResponse], status: str, stop_token: int | None = None
) -> dict[str, Any]:
    """The shape of one Generate call's responses, per `index` (n > 1 multiplexes indices)."""
    if status != "OK":
        return {"status": status}
    per_index: dict[int, list[pb.GenerateResponse]] = {}
    for response in responses:
        body = getattr(response, response.WhichOneof("response"))
        per_index.setdefault(body.index, []).append(response)
    shape: dict[str, Any] = {"status": "OK", "indices": sorted(per_index)}
    for index, items in sorted(per_index.items()):
        kinds = [r.WhichOneof("response") for r in items]
        chunks = [r.chunk for r in items if r.WhichOneof("response") == "chunk"]
        completes = [r.complete for r in items if r.WhichOneof("response") == "complete"]
        entry: dict[str, Any] = {
            "chunks": len(chunks),
            "completes": len(completes),
            "complete_is_last": bool(kinds) and kinds[-1] == "complete",
            "chunking": _chunking(chunks),
            "chunk_fields": sorted({f for c in chunks for f in _fields(c)}),
            "chunk_tokens_total": sum(len(c.token_ids) for c in chunks),
        }
        if chunks:
            counts = [c.completion_tokens for c in chunks]
            cumulative = list(_cumulative(len(c.token_ids) for c in chunks))
            entry["chunk_completion_tokens"] = "cumulative" if counts == cumulative else "other"
        for n, done in enumerate(completes):
            streamed = [t for c in chunks for t in c.token_ids]
            stop_kind = done.WhichOneof("matched_stop")
            matched = getattr(done, stop_kind) if stop_kind else None
            entry[f"complete_{n}"] = {
                "fields": _fields(done),
                "output_ids": _output_ids_relation(list(done.output_ids), chunks),
                "finish_reason": done.finish_reason,
                "prompt_tokens": done.prompt_tokens,
                "completion_tokens": done.completion_tokens,
                "cached_tokens": done.cached_tokens,
                "matched_stop": stop_kind,
                "matched_is_stop_token": None if matched is None else matched == stop_token,
                "stop_token_is_last_output": (
                    None
                    if stop_token is None or not (streamed or done.output_ids)
                    else (streamed or list(done.output_ids))[-1] == stop_token
                ),
            }
        shape[f"index_{index}"] = entry
    return shape


def _cumulative(sizes: Iterable[int]) -> Iterator[int]:
    total = 0
    for size in sizes:
        total += size
        yield total


def kv_shape(
    batches: list[common_pb2.KvEventBatch], fill_pages: int, extend_pages: int
) -> dict[str, Any]:
    """The shape of the KV-event stream over a cache fill (`fill_pages` pages of EXTENSION),
    its extension (`extend_pages` more) and a FlushCache."""
    events = [(b, e) for b in batches for e in b.events]
    stored = [e.stored for _, e in events if e.WhichOneof("data") == "stored"]
    blocks = [block for s in stored for block in s.blocks]
    chain = block_hash_chain(EXTENSION, PAGE_SIZE)
    pages = [
        list(EXTENSION[i : i + PAGE_SIZE]) for i in range(0, len(chain) * PAGE_SIZE, PAGE_SIZE)
    ]
    parents_ok = True
    position = 0
    for s in stored:
        if position == 0:
            parents_ok &= not s.HasField("parent_block_hash")
        else:
            parents_ok &= (
                s.HasField("parent_block_hash") and s.parent_block_hash == chain[position - 1]
            )
        position += len(s.blocks)
    event_batches = [b for b in batches if len(b.events)]
    load_only = [b for b in batches if b.HasField("load") and b.load.load_only]
    first = batches[0]
    records = [b for b in batches if b.HasField("load")]
    later_event_records = [b for b in event_batches if b is not records[0]] if records else []
    kinds: list[str] = []
    for _, e in events:
        kind = e.WhichOneof("data")
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    last_event_seq = 0
    repeats = True
    for b in batches:
        if b.HasField("load") and b.load.load_only:
            repeats &= b.sequence_number == last_event_seq
        elif len(b.events):
            last_event_seq = b.sequence_number
    cleared = [e.cleared for _, e in events if e.WhichOneof("data") == "cleared"]
    sequences = [b.sequence_number for b in event_batches]
    event_ids = [e.event_id for _, e in events]
    return {
        "first_batch": (
            f"load_only, sequence {first.sequence_number}"
            if first.HasField("load") and first.load.load_only
            else "an event batch"
        ),
        "event_kinds": kinds,
        "stored_pages": len(blocks),
        "stored_pages_expected": fill_pages + extend_pages,
        "blocks_per_stored_event": sorted({len(s.blocks) for s in stored}),
        "stored_event_fields": sorted(
            {f for s in stored for f in _fields(s)} - {"parent_block_hash"}
        ),
        "parent_block_hash": (
            "absent at the root, else the page before the event's first block"
            if parents_ok
            else "other"
        ),
        "block_fields": sorted({f for b in blocks for f in _fields(b)}),
        "block_size": sorted({b.block_size for b in blocks}),
        "tokens_per_block": sorted({len(b.token_ids) for b in blocks}),
        "block_tokens": (
            "the request's pages in order"
            if [list(b.token_ids) for b in blocks] == pages[: len(blocks)]
            else "other"
        ),
        "block_hashes": (
            "SGLang's SHA-256 page chain"
            if [b.block_hash for b in blocks] == chain[: len(blocks)]
            else "other"
        ),
        "tier": sorted({common_pb2.KvCacheTier.Name(s.tier) for s in stored}),
        "medium": sorted({s.medium for s in stored}),
        "locality": sorted(
            {common_pb2.KvCacheLocality.Name(s.locality) for s in stored if s.HasField("locality")}
        ),
        "cleared_events": len(cleared),
        "cleared_fields": sorted({f for c in cleared for f in _fields(c)}),
        "sequence_numbers": (
            "consecutive"
            if sequences == list(range(sequences[0], sequences[0] + len(sequences)))
            else "other"
        ),
        "event_ids": (
            "consecutive"
            if event_ids == list(range(event_ids[0], event_ids[0] + len(event_ids)))
            else "other"
        ),
        "dp_rank": sorted({b.dp_rank if b.HasField("dp_rank") else -1 for b in batches}),
        "snapshot_chunks": sum(1 for b in batches if b.HasField("snapshot")),
        "load_on_every_batch": all(b.HasField("load") for b in batches),
        "load_only_sequence": "repeats the last event batch's" if repeats else "other",
        "load_only_seen": bool(load_only),
        "first_record_fields": _first_record_fields(records, load_only, later_event_records),
        "event_batch_load_fields": sorted(
            {f for b in later_event_records for f in _optional_fields(b.load)}
        ),
        "load_only_fields": sorted(
            {f for b in load_only if b is not records[0] for f in _optional_fields(b.load)}
        ),
    }


def _first_record_fields(
    records: list[common_pb2.KvEventBatch],
    load_only: list[common_pb2.KvEventBatch],
    later_event_records: list[common_pb2.KvEventBatch],
) -> str | list[str]:
    """The stream's first load record against the later ones. Depending on timing, SGLang's
    first record carries the fields of its heartbeats (load_only) or those of its event
    batches, whichever kind the record is; a set of neither kind is listed."""
    if not records:
        return []
    first = records[0]
    fields = _optional_fields(first.load)
    heartbeats = sorted({f for b in load_only if b is not first for f in _optional_fields(b.load)})
    batches = sorted({f for b in later_event_records for f in _optional_fields(b.load)})
    if fields in (heartbeats, batches):
        return "those of the later heartbeats or event batches"
    return fields


def _relation(value: object, own: object, default: object, name: str) -> str:
    """`value` described as the tokenizer's own (`own`), the servicer's `default`, or other."""
    if value == own:
        return "the tokenizer's"
    if value == default:
        return f"{name} {default!r}"
    return "other"


def _arg_kind(struct: Any, key: str) -> str:
    """The JSON kind of `key` in a protobuf Struct ("absent" when missing)."""
    if key not in struct.fields:
        return "absent"
    kind = struct.fields[key].WhichOneof("kind")
    return {
        "number_value": "number",
        "string_value": "string",
        "bool_value": "bool",
        "null_value": "null",
        "struct_value": "object",
        "list_value": "list",
    }[kind]


# ------------------------------------------------------------------------------- recording


async def _call(
    stub: pb_grpc.SglangSchedulerStub, request: pb.GenerateRequest, timeout_s: float = 60.0
) -> tuple[list[pb.GenerateResponse], str]:
    """Every response of one Generate call and its final status name."""
    responses: list[pb.GenerateResponse] = []
    try:
        async for response in stub.Generate(request, timeout=timeout_s):
            responses.append(response)
    except grpc.aio.AioRpcError as err:
        return responses, err.code().name
    return responses, "OK"


def _request(
    request_id: str,
    prompt: tuple[int, ...] | list[int] = PROMPT,
    max_new_tokens: int = MAX_NEW,
    **overrides: Any,
) -> pb.GenerateRequest:
    """The wire request homing's client builds: greedy, ignore_eos unless overridden."""
    overrides.setdefault("temperature", 0.0)
    overrides.setdefault("ignore_eos", True)
    return build_generate_request(
        GenerateParams(
            request_id=request_id,
            input_ids=list(prompt),
            max_new_tokens=max_new_tokens,
            **overrides,
        )
    )


async def _until(check: Callable[[], Awaitable[bool]], what: str, within_s: float = WAIT_S) -> None:
    """Poll `check` until it holds; AssertionError naming `what` past the deadline."""
    deadline = time.monotonic() + within_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s} s")
        await asyncio.sleep(0.05)


def _pages(batches: list[common_pb2.KvEventBatch]) -> int:
    """Blocks stored by the stored events of `batches`."""
    return sum(
        len(e.stored.blocks) for b in batches for e in b.events if e.WhichOneof("data") == "stored"
    )


def _has_event(batches: list[common_pb2.KvEventBatch], kind: str) -> bool:
    """Whether an event of `kind` ("stored", "removed", "cleared") is in `batches`."""
    return any(e.WhichOneof("data") == kind for b in batches for e in b.events)


def _load_only_after_last_event(batches: list[common_pb2.KvEventBatch]) -> bool:
    """Whether a load_only record follows the last batch that carries events."""
    last = max((i for i, b in enumerate(batches) if len(b.events)), default=None)
    return last is not None and any(
        b.HasField("load") and b.load.load_only for b in batches[last + 1 :]
    )


async def _running(client: EngineClient) -> int:
    return sum(load.num_running_reqs for load in (await client.loads()).loads)


def _without_leftover_clears(
    batches: list[common_pb2.KvEventBatch],
) -> list[common_pb2.KvEventBatch]:
    """`batches` less those before the first stored event that hold only cleared events: the
    worker was flushed just before this subscription opened (the session fleet hands it out
    flushed), and SGLang publishes that flush's cleared event a moment after FlushCache
    returns, so it can reach the new subscription first."""
    out: list[common_pb2.KvEventBatch] = []
    stored = False
    for b in batches:
        kinds = {e.WhichOneof("data") for e in b.events}
        if not stored and kinds == {"cleared"}:
            continue
        stored = stored or "stored" in kinds
        out.append(b)
    return out


async def _record_kv(
    stub: pb_grpc.SglangSchedulerStub, client: EngineClient, shapes: dict[str, Any]
) -> list[int]:
    """The KV phase on a fresh worker: fill, extend, flush. Returns the greedy tokens of PROMPT."""
    kv = KvSubscription(stub)
    try:
        await kv.open(WAIT_S)
        responses, status = await _call(stub, _request("kv-fill"))
        shapes["generate"]["stream"] = generate_shape(responses, status)
        tokens = [
            t for r in responses if r.WhichOneof("response") == "chunk" for t in r.chunk.token_ids
        ]
        fill_pages = (len(PROMPT) + MAX_NEW - 1) // PAGE_SIZE

        def filled(batches: list[common_pb2.KvEventBatch]) -> bool:
            # the completion changes the load: a load_only record
            return _pages(batches) >= fill_pages and _load_only_after_last_event(batches)

        await kv.until(filled, "stored events for the cache fill, then a load_only record", WAIT_S)
        _, status = await _call(stub, _request("kv-extend", EXTENSION, 1, stream=False))
        assert status == "OK"
        extend_pages = len(EXTENSION) // PAGE_SIZE - fill_pages

        def extended(batches: list[common_pb2.KvEventBatch]) -> bool:
            return _pages(batches) >= fill_pages + extend_pages

        await kv.until(extended, "stored events for the extension", WAIT_S)
        flushed = await client.flush_cache(timeout_s=5.0)
        shapes["flush"] = {"success": flushed}

        def cleared(batches: list[common_pb2.KvEventBatch]) -> bool:
            return _has_event(_without_leftover_clears(batches), "cleared")

        await kv.until(cleared, "a cleared event after FlushCache", WAIT_S)
        batches = _without_leftover_clears(kv.batches)
        shapes["kv_events"] = kv_shape(batches, fill_pages, extend_pages)
    finally:
        await kv.close()
    return tokens


async def _record_generate(
    stub: pb_grpc.SglangSchedulerStub, shapes: dict[str, Any], tokens: list[int], eos: int
) -> None:
    """The Generate cases, each after the one before it (the cache state is part of the shape)."""
    gen = shapes["generate"]
    # a stop token first generated third (the greedy output of each engine is fixed)
    stop = next(t for i, t in enumerate(tokens) if i >= 2 and t not in tokens[:i])

    async def case(name: str, request: pb.GenerateRequest, stop_token: int | None = None) -> None:
        gen[name] = generate_shape(*await _call(stub, request), stop_token=stop_token)

    await case("stream_after_flush", _request("after-flush"))
    await case("stream_cached", _request("cached"))
    await case("nonstream", _request("nonstream", stream=False))
    await case("stream_stop_token", _request("stop", stop_token_ids=[stop], ignore_eos=False), stop)
    await case(
        "nonstream_stop_token",
        _request("stop-n", stop_token_ids=[stop], ignore_eos=False, stream=False),
        stop,
    )
    await case(
        "stream_stop_token_with_ignore_eos",
        _request("stop-ignore", stop_token_ids=[stop], ignore_eos=True),
        stop,
    )
    eos_bias = {eos: 100.0}
    await case(
        "stream_eos", _request("eos", max_new_tokens=4, ignore_eos=False, logit_bias=eos_bias), eos
    )
    await case(
        "nonstream_eos",
        _request("eos-n", max_new_tokens=4, ignore_eos=False, logit_bias=eos_bias, stream=False),
        eos,
    )
    await case(
        "stream_eos_with_ignore_eos",
        _request("eos-ignore", max_new_tokens=4, ignore_eos=True, logit_bias=eos_bias),
        eos,
    )
    await case("stream_max_new_0", _request("zero", max_new_tokens=0))
    await case("nonstream_max_new_0", _request("zero-n", max_new_tokens=0, stream=False))
    await case("stream_max_new_1", _request("one", max_new_tokens=1))
    await case("nonstream_max_new_1", _request("one-n", max_new_tokens=1, stream=False))
    for name, stream in (("stream_n2", True), ("nonstream_n2", False)):
        request = _request(name, max_new_tokens=4, temperature=1.0, stream=stream)
        request.sampling_params.n = 2
        await case(name, request)
    request = _request("n-unset", max_new_tokens=4)
    request.sampling_params.n = 0
    await case("stream_n_unset", request)


CONSTRAINED_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "unit": {"enum": ["c", "f"]}},
    "required": ["ok", "unit"],
    "additionalProperties": False,
}
"""The schema of the constrained cases: every value bounded, so even the random-weight model
(the test workers allow no free whitespace) closes it within a few tokens."""


def _logprob_shape(responses: list[pb.GenerateResponse], top: int) -> dict[str, Any]:
    """Where a logprob request's entries come: per chunk, whether its output entries align
    with its tokens (with `top` alternatives each), which chunks carry prompt entries, and
    what the `complete` repeats."""
    chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk"]
    completes = [r.complete for r in responses if r.WhichOneof("response") == "complete"]
    aligned = all(
        list(c.output_logprobs.token_ids) == list(c.token_ids)
        and len(c.output_logprobs.token_logprobs) == len(c.token_ids)
        and all(len(t.token_ids) == top for t in c.output_logprobs.top_logprobs)
        for c in chunks
    )
    shape: dict[str, Any] = {
        "chunk_entries_align_with_tokens": aligned,
        "chunks_with_prompt_entries": [
            i for i, c in enumerate(chunks) if c.HasField("input_logprobs")
        ],
        "sampled_is_top1_at_temperature_0": all(
            not t.token_ids or t.token_ids[0] == token
            for c in chunks
            for token, t in zip(c.token_ids, c.output_logprobs.top_logprobs, strict=False)
        ),
    }
    if completes:
        done = completes[-1]
        shape["complete_entries"] = len(done.output_logprobs.token_ids)
        shape["complete_entries_are_last_chunks"] = bool(chunks) and list(
            done.output_logprobs.token_ids
        ) == list(chunks[-1].token_ids)
        shape["complete_has_prompt_entries"] = done.HasField("input_logprobs")
        if done.HasField("input_logprobs"):
            values = done.input_logprobs.token_logprobs
            shape["complete_prompt_entries"] = len(values)
            shape["first_prompt_entry_has_value"] = bool(values) and values[0].HasField("value")
    if chunks and chunks[0].HasField("input_logprobs"):
        values = chunks[0].input_logprobs.token_logprobs
        shape["chunk_prompt_entries"] = len(values)
        shape["first_prompt_entry_has_value"] = bool(values) and values[0].HasField("value")
    return shape


async def _record_features(
    stub: pb_grpc.SglangSchedulerStub, shapes: dict[str, Any], tokenizer: TextTokenizer
) -> None:
    """Constraints, seed and log probabilities: status and shape of each, and whether a
    constrained answer is an instance of its constraint (the model's weights are random)."""
    gen = shapes["generate"]
    features: dict[str, Any] = {}

    async def constrained(name: str, **fields: Any) -> None:
        request = _request(name, max_new_tokens=64, ignore_eos=False, stream=False, **fields)
        responses, status = await _call(stub, request)
        gen[name] = generate_shape(responses, status)
        done = [r.complete for r in responses if r.WhichOneof("response") == "complete"]
        text = tokenizer.decode(list(done[-1].output_ids)) if done else ""
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        features[f"{name}_is_an_instance"] = (
            isinstance(value, dict)
            and set(value) == {"ok", "unit"}
            and isinstance(value["ok"], bool)
            and value["unit"] in ("c", "f")
        )

    await constrained("nonstream_json_schema", json_schema=json.dumps(CONSTRAINED_SCHEMA))
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": CONSTRAINED_SCHEMA, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    responses, status = await _call(
        stub, _request("tag", max_new_tokens=8, structural_tag=json.dumps(tag))
    )
    features["structural_tag_status"] = status
    _, status = await _call(stub, _request("bad-schema", json_schema="{not json", stream=False))
    features["invalid_json_schema_status"] = status
    _, status = await _call(stub, _request("seed", max_new_tokens=4, temperature=1.0, seed=7))
    features["seed_in_custom_params_status"] = status
    for name, stream in (("stream_logprobs", True), ("nonstream_logprobs", False)):
        request = _request(
            name,
            max_new_tokens=4,
            stream=stream,
            return_logprob=True,
            top_logprobs_num=3,
            logprob_start_len=0,
        )
        responses, status = await _call(stub, request)
        features[name] = {"status": status, **_logprob_shape(responses, 3)}
    request = _request(
        "logprob-past-prompt", return_logprob=True, logprob_start_len=len(PROMPT) + 1
    )
    _, status = await _call(stub, request)
    features["logprob_start_past_prompt_status"] = status
    shapes["features"] = features


async def _record_limits(
    stub: pb_grpc.SglangSchedulerStub, shapes: dict[str, Any], max_req_input_len: int
) -> None:
    """Prompts at the edges of the worker's own `max_req_input_len`."""
    gen = shapes["generate"]
    over = [2000 + i % 500 for i in range(max_req_input_len + 2)]
    responses, status = await _call(stub, _request("over", over, 4))
    gen["prompt_over_max_req_input_len"] = generate_shape(responses, status)
    near = [3000 + i % 500 for i in range(max_req_input_len - 10)]
    responses, status = await _call(stub, _request("near", near, 200, stream=False))
    shape = generate_shape(responses, status)
    if status == "OK":  # only the count relative to the window is a shape, not the prompt
        shape["index_0"]["complete_0"]["prompt_tokens"] = "max_req_input_len - 10"
    gen["prompt_plus_max_new_over_window"] = shape


async def _record_abort(
    stub: pb_grpc.SglangSchedulerStub, client: EngineClient, shapes: dict[str, Any]
) -> None:
    """Abort mid-stream, Abort of an unknown id, and a second request reusing an id in flight."""
    call = stub.Generate(_request("abort-me", max_new_tokens=3000), timeout=60.0)
    stream = call.__aiter__()
    for _ in range(2):
        await stream.__anext__()
    answer = await stub.Abort(pb.AbortRequest(request_id="abort-me", reason="shape"), timeout=5)
    after: list[pb.GenerateResponse] = []

    async def drain() -> str:
        async for response in stream:
            after.append(response)
        return "ended"

    try:
        end = await asyncio.wait_for(drain(), ABORT_QUIET_S)
    except TimeoutError:
        end = "open"
    except grpc.aio.AioRpcError as err:
        end = f"status {err.code().name}"
    call.cancel()
    kinds = [r.WhichOneof("response") for r in after]
    # Chunks of steps the engine ran before the Abort reached its scheduler come first on a
    # busy machine; the shape is what follows them.
    while kinds and kinds[0] == "chunk":
        kinds.pop(0)
    finish = [r.complete.finish_reason for r in after if r.WhichOneof("response") == "complete"]
    abort: dict[str, Any] = {
        "abort_success": answer.success,
        "stream_after_abort": f"{end}; after it: {kinds}; finish_reason: {finish}",
    }

    async def idle() -> bool:
        return await _running(client) == 0

    await _until(idle, "no request running after Abort")
    abort["running_after_abort"] = await _running(client)
    unknown = await stub.Abort(pb.AbortRequest(request_id="never-sent"), timeout=5)
    abort["abort_unknown_request_success"] = unknown.success

    first = stub.Generate(_request("twice", max_new_tokens=3000), timeout=60.0)
    await first.__aiter__().__anext__()
    _, status = await _call(stub, _request("twice", max_new_tokens=3), timeout_s=30.0)
    abort["duplicate_request_id"] = "accepted" if status == "OK" else status
    first.cancel()
    await stub.Abort(pb.AbortRequest(request_id="twice"), timeout=5)
    await _until(idle, "no request running after the duplicate's Abort")
    shapes["abort"] = abort


async def _record_info(
    stub: pb_grpc.SglangSchedulerStub,
    client: EngineClient,
    shapes: dict[str, Any],
    tokenizer: TextTokenizer,
) -> None:
    """HealthCheck, GetModelInfo, GetServerInfo, GetLoads, SubscribeKvEvents from a cursor."""
    before = (await client.server_info()).last_receive_timestamp
    health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=30)
    server = await client.server_info()
    shapes["health"] = {
        "healthy": health.healthy,
        "message": health.message,
        "health_check_reaches_engine": server.last_receive_timestamp > before,
    }
    info = await client.model_info()
    shapes["model_info"] = {
        "fields_set": _fields(info),
        "vocab_size": _relation(info.vocab_size, tokenizer.vocab_size, 128256, "servicer default"),
        "bos_token_id": _relation(info.bos_token_id, tokenizer.bos_token_id, 1, "servicer default"),
        "eos_token_ids": _relation(
            tuple(info.eos_token_ids), tokenizer.eos_token_ids, (), "servicer default"
        ),
        "pad_token_id": _relation(info.pad_token_id, tokenizer.pad_token_id, 0, "servicer default"),
        "max_context_length": (
            "max_total_num_tokens (the KV pool)"
            if info.max_context_length == server.max_total_num_tokens
            else "the context window"
            if info.max_context_length == CONTEXT_TOKENS
            else "other"
        ),
        "max_req_input_len": info.max_req_input_len,
        "served_model_name": "set" if info.served_model_name else "empty",
        "tokenizer_path": "model_path" if info.tokenizer_path == info.model_path else "other",
        "is_generation": info.is_generation,
        "supports_vision": info.supports_vision,
        "model_type": info.model_type,
        "architectures": list(info.architectures),
        "weight_version": info.weight_version,
        "id2label_json": info.id2label_json,
        "default_sampling_params_json": info.default_sampling_params_json,
    }
    args = server.server_args
    shapes["server_info"] = {
        # active_requests is left out: SGLang counts an aborted request until the handler of
        # its cancelled stream has exited (a value that depends on timing, not a shape)
        "fields_set": [f for f in _fields(server) if f != "active_requests"],
        "server_type": server.server_type,
        "sglang_version": server.sglang_version,
        "scheduler_info_keys": sorted(server.scheduler_info.fields),
        "server_args": {
            key: _arg_kind(args, key)
            for key in (
                "page_size",
                "max_running_requests",
                "max_total_tokens",
                "context_length",
                "chunked_prefill_size",
                "grammar_backend",
                "kv_events_config",
                "stream_interval",
            )
        },
        "page_size": args.fields["page_size"].number_value if "page_size" in args.fields else None,
    }
    loads = await client.loads()
    shapes["loads"] = {
        "top_fields": _fields(loads),
        "version": loads.version,
        "dp_rank_count": loads.dp_rank_count,
        "ranks": len(loads.loads),
        "max_total_num_tokens": (
            "GetServerInfo's"
            if loads.loads and loads.loads[0].max_total_num_tokens == server.max_total_num_tokens
            else "other"
        ),
        "sections_all": _optional_fields(loads.loads[0]),
    }
    for name, include in (("sections_default_include", []), ("sections_core", ["core"])):
        answer = await stub.GetLoads(pb.GetLoadsRequest(include=include), timeout=10)
        shapes["loads"][name] = _optional_fields(answer.loads[0])
    try:
        await stub.GetLoads(pb.GetLoadsRequest(include=["bogus"]), timeout=10)
        shapes["loads"]["unknown_section"] = "OK"
    except grpc.aio.AioRpcError as err:
        shapes["loads"]["unknown_section"] = err.code().name
    resume = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=5))
    try:
        await asyncio.wait_for(resume.__aiter__().__anext__(), WAIT_S)
        shapes["kv_resume_from_sequence_5"] = "a batch"
    except grpc.aio.AioRpcError as err:
        shapes["kv_resume_from_sequence_5"] = err.code().name
    finally:
        resume.cancel()


async def _record_tokenizer(
    stub: pb_grpc.SglangSchedulerStub, client: EngineClient, shapes: dict[str, Any]
) -> TextTokenizer:
    """GetTokenizer's chunking and digest; the bundle as homing's tokenizer."""
    sizes: list[int] = []
    digests: list[str] = []
    async for chunk in stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=60):
        sizes.append(len(chunk.data))
        digests.append(chunk.sha256)
    bundle = await client.tokenizer_bundle()  # checks the digest (EngineError otherwise)
    shapes["tokenizer"] = {
        "chunk_bytes": sorted(set(sizes[:-1])),
        "last_chunk_smaller": sizes[-1] <= (sizes[0] if sizes else 0),
        "sha256": (
            "hex on the last chunk only"
            if all(not d for d in digests[:-1]) and len(digests[-1]) == 64
            else "other"
        ),
        "homing_client_accepts_bundle": True,
        "files": sorted(zipfile.ZipFile(io.BytesIO(bundle)).namelist()),
    }
    return TextTokenizer.from_bundle(bundle)


async def record_shapes(url: str) -> dict[str, Any]:
    """Run the fixed requests against the worker at `url` (fresh: nothing cached, nothing
    subscribed) and return their shapes."""
    shapes: dict[str, Any] = {"generate": {}}
    client = EngineClient(url, worker_id="shapes")
    channel = grpc.aio.insecure_channel(grpc_target(url))
    stub = pb_grpc.SglangSchedulerStub(channel)
    try:
        tokens = await _record_kv(stub, client, shapes)
        tokenizer = await _record_tokenizer(stub, client, shapes)
        await _record_generate(stub, shapes, tokens, tokenizer.eos_token_ids[0])
        await _record_features(stub, shapes, tokenizer)
        info = await client.model_info()
        await _record_limits(stub, shapes, info.max_req_input_len)
        await _record_abort(stub, client, shapes)
        await _record_info(stub, client, shapes, tokenizer)
    finally:
        await channel.close()
        await client.close()
    return shapes


# ------------------------------------------------------------------------------- comparing


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def _covered(path: str, prefixes: dict[str, Any]) -> str | None:
    """The entry of `prefixes` covering `path` (itself or an ancestor), or None."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in prefixes:
            return candidate
    return None


def differences(
    recorded: dict[str, Any], live: dict[str, Any], skip: dict[str, str] | None = None
) -> list[str]:
    """One readable line per fact that differs between `recorded` and `live` (paths under
    `skip` left out)."""
    a, b = _flatten(recorded), _flatten(live)
    lines = []
    for path in sorted(a.keys() | b.keys()):
        if skip and _covered(path, skip):
            continue
        was, now = a.get(path, "<missing>"), b.get(path, "<missing>")
        if was != now:
            lines.append(f"  {path}: recorded {was!r}, live {now!r}")
    return lines


def _tolerated(path: str, recorded: dict[str, Any], sim: dict[str, Any]) -> bool:
    """Whether the simulator's value at `path` (flattened) is one SIM_TOLERATED allows."""
    entry = SIM_TOLERATED.get(path.rsplit(".", 1)[-1])
    return entry is not None and entry[0](recorded.get(path), sim.get(path))


# ------------------------------------------------------------------------------- workers


def _sim_config() -> SimConfig:
    """The simulator configured like the real worker: page, pool and context."""
    return SimConfig(
        page_size=PAGE_SIZE, kv_capacity_tokens=KV_POOL_TOKENS, max_context_length=CONTEXT_TOKENS
    )


async def _record_sim() -> dict[str, Any]:
    async with SimWorker(_sim_config(), sidecar=False) as sim:
        return await record_shapes(sim.url)


@pytest.fixture(scope="module")
def real_worker(sglang_fleet: Fleet) -> str:
    """A real SGLang 0.5.23 worker on the CPU (the session's, started by `homing worker` with
    the recipe's flags), its cache flushed so the recording starts fresh."""

    async def flush(url: str) -> bool:
        client = EngineClient(url, worker_id="real")
        try:
            return await client.flush_cache(timeout_s=30.0)
        finally:
            await client.close()

    sglang_fleet.ensure_running()
    url = sglang_fleet.urls[0]
    assert asyncio.run(flush(url)), "the real worker did not flush its cache"
    return url


@pytest.fixture(scope="module")
def real_shapes(real_worker: str) -> dict[str, Any]:
    """The real worker's shapes, recorded once while it is fresh."""
    return asyncio.run(record_shapes(real_worker))


def _load_recorded() -> dict[str, Any]:
    if not RECORDED.exists():
        pytest.fail(f"{RECORDED} is missing: run this module with {RECORD_ENV}=1 and SGLang")
    return json.loads(RECORDED.read_text())


# ------------------------------------------------------------------------------- tests


@pytest.mark.timeout(360)
def test_real_sglang_worker_matches_the_recorded_protocol(real_shapes: dict[str, Any]) -> None:
    if os.environ.get(RECORD_ENV) == "1":
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        RECORDED.write_text(json.dumps(real_shapes, indent=2, sort_keys=True) + "\n")
    lines = differences(_load_recorded(), real_shapes)
    assert not lines, (
        f"the real SGLang worker's protocol differs from {RECORDED.name} (a new release? "
        f"re-record with {RECORD_ENV}=1 and update docs/protocol-fidelity.md):\n" + "\n".join(lines)
    )


@pytest.mark.timeout(120)
def test_simulator_matches_the_recorded_protocol_but_for_the_listed_differences() -> None:
    recorded = _load_recorded()
    sim = asyncio.run(_record_sim())
    flat_recorded, flat_sim = _flatten(recorded), _flatten(sim)
    lines = [
        line
        for line in differences(recorded, sim, skip=SIM_DIFFERENCES)
        if not _tolerated(line.split(":", 1)[0].strip(), flat_recorded, flat_sim)
    ]
    assert not lines, (
        "the simulator differs from the recorded SGLang protocol (fix the simulator, or list the "
        "difference in SIM_DIFFERENCES with its reason):\n" + "\n".join(lines)
    )
    stale = [
        path
        for path in SIM_DIFFERENCES
        if {k: v for k, v in flat_recorded.items() if _covered(k, {path: 0})}
        == {k: v for k, v in flat_sim.items() if _covered(k, {path: 0})}
    ]
    assert not stale, f"no longer differ, remove them from SIM_DIFFERENCES: {stale}"


async def _homing_client_checks(url: str) -> None:
    client = EngineClient(url, worker_id="w")
    try:
        received: list[int] = []
        done: GenerateDone | None = None
        async for item in client.generate(
            GenerateParams("stream", PROMPT, MAX_NEW, temperature=0.0, ignore_eos=True)
        ):
            if isinstance(item, TokenChunk):
                received.extend(item.token_ids)
            else:
                done = item
        assert done is not None
        streamed = [*received, *done.new_tokens(len(received))]
        whole: GenerateDone | None = None
        async for item in client.generate(
            GenerateParams("whole", PROMPT, MAX_NEW, temperature=0.0, ignore_eos=True, stream=False)
        ):
            assert isinstance(item, GenerateDone)
            whole = item
        assert whole is not None
        assert streamed == list(whole.token_ids)
        assert len(streamed) == MAX_NEW == done.completion_tokens

        stream = client.generate(
            GenerateParams("closed", PROMPT, 3000, temperature=0.0, ignore_eos=True)
        )
        for _ in range(2):
            assert isinstance(await stream.__anext__(), TokenChunk)
        await stream.aclose()  # cancels the call and sends Abort

        async def idle() -> bool:
            return await _running(client) == 0

        await _until(idle, "the closed stream's request stopped running")
        assert await client.health_check(timeout_s=5.0)
    finally:
        await client.close()


@pytest.mark.timeout(360)
def test_homing_client_takes_each_token_once_and_aborts_on_close_on_real_sglang(
    real_worker: str, real_shapes: dict[str, Any]
) -> None:
    asyncio.run(_homing_client_checks(real_worker))


@pytest.mark.timeout(60)
def test_homing_client_takes_each_token_once_and_aborts_on_close_on_the_simulator() -> None:
    async def run() -> None:
        async with SimWorker(_sim_config(), sidecar=False) as sim:
            await _homing_client_checks(sim.url)

    asyncio.run(run())
