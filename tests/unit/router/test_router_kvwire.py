"""The native KV-event reader (`homing.router._kvwire`) feeds the index exactly what the
pure-Python path (`ingest_batch_python`) feeds it, and rejects malformed bytes cleanly; on
the wire bytes (`decode_batch`) it reads the header as upb does and raises for exactly the
bytes upb rejects, as the pure-Python fallback does."""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from smg_grpc_proto.generated import common_pb2

from homing.router import events
from homing.router.events import (
    BatchCounts,
    DecodedBatch,
    KvEvent,
    decode_batch,
    ingest_batch,
    ingest_batch_python,
    ingest_decoded,
)
from homing.router.index import PrefixIndex

try:
    from homing.router import _kvwire
except ImportError:  # pragma: no cover - reported by test_extension_is_built
    _kvwire = None

needs_native = pytest.mark.skipif(
    _kvwire is None, reason="homing.router._kvwire not built (see test_extension_is_built)"
)

BS = 16
U32 = 2**32 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
MALFORMED = re.compile(r"^malformed KvEventBatch: .+ at byte \d+$")


def test_extension_is_built() -> None:
    """`make` (pip install -e .) builds the extension; without it ingestion runs ~2x slower."""
    assert _kvwire is not None, (
        "homing.router._kvwire is not built: it needs a C compiler (Debian: apt-get install "
        "gcc); then `make clean && make`"
    )
    assert events._kvwire is _kvwire


# ------------------------------------------------------------------ recording sink


class RecordingSink:
    """Records every call `ingest_batch` makes, with plain copies of its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def store_blocks(
        self, worker_id: str, items: Sequence[tuple[int, int | None, bytes, int]]
    ) -> int:
        copied = [tuple(item) for item in items]
        for engine_hash, parent, data, tier in copied:
            assert type(engine_hash) is int and type(tier) is int
            assert parent is None or type(parent) is int
            assert type(data) is bytes
        self.calls.append(("store", worker_id, copied))
        # a count that depends on the items, so BatchCounts is checked too
        return sum(1 for _, _, data, _ in copied if len(data) == 4 * BS)

    def remove_blocks(
        self,
        worker_id: str,
        engine_hashes: Iterable[int],
        tier: int | None = None,
        shared: bool = False,
    ) -> None:
        assert tier is None or type(tier) is int
        self.calls.append(("remove", worker_id, list(engine_hashes), tier, bool(shared)))

    def apply(self, worker_id: str, event: KvEvent) -> None:
        self.calls.append(("apply", worker_id, event))


def run_both(batch: common_pb2.KvEventBatch) -> tuple[RecordingSink, BatchCounts]:
    """Feed `batch` through the native and the Python path; assert the same calls and
    counts; return the sink and counts."""
    native, python = RecordingSink(), RecordingSink()
    got = ingest_batch(batch, native, "w")
    want = ingest_batch_python(batch, python, "w")
    assert native.calls == python.calls
    assert got == want
    return native, got


def ingest_raw(raw: bytes, sink: RecordingSink) -> BatchCounts:
    """The native path on bytes as given (not re-serialized by upb) into a fresh `sink`:
    `decode_batch`, checked against the pure-Python fallback on the same bytes
    (`check_bytes`) and against `parse_events` with the events it leaves to Python read
    from upb's parse."""
    assert _kvwire is not None
    check_bytes(raw)
    counts = ingest_decoded(decode_batch(raw), sink, "w")
    parsed = common_pb2.KvEventBatch.FromString(raw)
    items = [parsed.events[x] if type(x) is int else x for x in _kvwire.parse_events(raw)]
    by_index = RecordingSink()
    assert events._ingest_items(items, by_index, "w") == counts
    assert by_index.calls == sink.calls
    return counts


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    """Within the block `homing.router.events` runs without its C reader (the fallback)."""
    saved = events._kvwire
    events._kvwire = None
    try:
        yield
    finally:
        events._kvwire = saved


def header_fields(batch: DecodedBatch) -> tuple[Any, ...]:
    """What a reader of the header sees (the timestamp as its bits: NaN is NaN)."""
    h = batch.header
    return (
        h.sequence_number,
        struct.pack("<d", h.timestamp),
        h.dp_rank if h.HasField("dp_rank") else None,
        h.load.SerializeToString() if h.HasField("load") else None,
        h.snapshot.SerializeToString() if h.HasField("snapshot") else None,
        batch.num_events,
    )


def decode_both(raw: bytes) -> tuple[DecodedBatch, DecodedBatch] | None:
    """`decode_batch(raw)` natively and in pure Python: both raise ValueError (None) or
    neither does, and exactly when upb rejects `raw`."""
    try:
        common_pb2.KvEventBatch.FromString(raw)
        upb_ok = True
    except DecodeError:
        upb_ok = False
    outcomes: list[DecodedBatch | None] = []
    for ctx in (contextlib.nullcontext(), pure_python()):
        with ctx:
            try:
                outcomes.append(decode_batch(raw))
            except ValueError as err:
                assert str(err).startswith("malformed KvEventBatch: "), err
                outcomes.append(None)
    native, python = outcomes
    assert (native is not None) == (python is not None) == upb_ok, (native, python, upb_ok)
    if native is None or python is None:
        return None
    return native, python


def check_bytes(raw: bytes) -> tuple[RecordingSink, BatchCounts] | None:
    """The wire-bytes entry point, native against pure Python on `raw`: same errors, same
    header, same sink calls and counts (a decoded batch ingested twice, too); returns the
    native sink and counts (None: `raw` is malformed)."""
    decoded = decode_both(raw)
    if decoded is None:
        return None
    native, python = decoded
    assert header_fields(native) == header_fields(python)
    sinks = [RecordingSink() for _ in range(3)]
    counts = [
        ingest_decoded(native, sinks[0], "w"),
        ingest_decoded(python, sinks[1], "w"),
        ingest_decoded(native, sinks[2], "w"),  # the decoded batch is not used up
    ]
    assert sinks[0].calls == sinks[1].calls == sinks[2].calls
    assert counts[0] == counts[1] == counts[2]
    return sinks[0], counts[0]


# ------------------------------------------------------------------ random batches


def _hash(rng: random.Random) -> int:
    return rng.choice([rng.randrange(I64_MIN, I64_MAX + 1), rng.randrange(-5, 2**20), I64_MIN])


def _tokens(rng: random.Random) -> list[int]:
    n = BS if rng.random() < 0.9 else rng.choice([0, 1, BS - 1, BS + 1, 2 * BS])
    return [rng.choice([0, 1, 127, 128, U32, rng.randrange(U32 + 1)]) for _ in range(n)]


def _tier(rng: random.Random) -> int | None:
    """None: unset; else a KvCacheTier value, now and then one the schema does not name."""
    if rng.random() < 0.1:
        return rng.choice([5, 7, -1, 2**31 - 1])
    return rng.choice([None, None, 0, 1, 2, 3, 4])


def _level(rng: random.Random) -> int | None:
    if rng.random() < 0.1:
        return rng.choice([9, -1, -(2**31), 2**31 - 1])
    return rng.choice([None, None, None, 0, 1, 2, 3])


def _locality(rng: random.Random) -> int | None:
    if rng.random() < 0.05:
        return rng.choice([3, -2])
    return rng.choice([None, None, 0, 1, 1, 2])


# the fast shape (expected in a native list) and every way out of it
STORED_KINDS = [
    *["fast"] * 16,
    "lora_name",
    "cache_salt",
    "spec_kind",
    "spec_full",
    "sliding",
    "remote",
    "lora_id",
    "extra_keys",
    "multi",
    "no_blocks",
]


class Gen:
    """Random batches; `expected` records how the native reader should classify each event
    ('fast', 'removed' or 'index') where the schema makes that certain."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.known: list[int] = []

    def _parent(self) -> int | None:
        rng = self.rng
        if not self.known or rng.random() < 0.2:
            return None if rng.random() < 0.7 else _hash(rng)
        return rng.choice(self.known[-32:])

    def stored(self, ev: common_pb2.KvCacheEvent) -> str:
        rng = self.rng
        kind = rng.choice(STORED_KINDS)
        st = ev.stored
        n_blocks = {"multi": rng.randint(2, 4), "no_blocks": 0}.get(kind, 1)
        parent = self._parent()
        if parent is not None:
            st.parent_block_hash = parent
        tier, level, locality = _tier(rng), _level(rng), _locality(rng)
        if kind == "remote":
            locality = 2
        elif locality == 2:
            locality = 1
        if tier is not None:
            st.tier = tier
        if locality is not None:
            st.locality = locality
        for _ in range(n_blocks):
            h = _hash(rng)
            self.known.append(h)
            block = st.blocks.add(block_hash=h, token_ids=_tokens(rng))
            if rng.random() < 0.5:
                block.block_size = BS
            if level is not None:
                block.cache_level = level
        # fields the Python fast path ignores, and empty namespace strings
        if rng.random() < 0.3:
            st.medium = rng.choice(["", "GPU", "cpu_pinned", "hôte-😀"])
        if rng.random() < 0.3:
            st.group_idx = rng.choice([0, 1, U32])
        if rng.random() < 0.2:
            st.ownership = "engine"
        if rng.random() < 0.2:
            st.session_id = "s1"
        if rng.random() < 0.2:
            st.lora_name = ""
        if rng.random() < 0.2:
            st.cache_salt = ""
        if rng.random() < 0.2:
            st.kv_cache_spec_kind = ""
        if rng.random() < 0.2:
            st.kv_cache_spec_sliding_window = 0
        if kind == "lora_name":
            st.lora_name = "adapter-1"
        elif kind == "cache_salt":
            st.cache_salt = "salt"
        elif kind == "spec_kind":
            st.kv_cache_spec_kind = "sliding_window"
        elif kind == "spec_full":
            st.kv_cache_spec_kind = "FullAttentionSpec"
        elif kind == "sliding":
            st.kv_cache_spec_sliding_window = rng.choice([1, 4096, U32])
        elif kind == "lora_id":
            st.blocks[0].lora_id = rng.choice([0, 3, -1])
        elif kind == "extra_keys":
            key = st.blocks[0].extra_keys.add()
            rng.choice([lambda: None, lambda: setattr(key, "text", "x")])()
        if kind not in ("fast", "multi"):
            return "index"
        # in range for the native reader: a named tier, non-negative int32 cache_level/locality
        tier_ok = tier is None or 0 <= tier <= 4
        level_ok = level is None or level >= 0
        locality_ok = locality is None or locality >= 0
        return "fast" if tier_ok and level_ok and locality_ok else "index"

    def removed(self, ev: common_pb2.KvCacheEvent) -> str:
        rng = self.rng
        rm = ev.removed
        n = rng.choice([0, 1, 1, 2, 5])
        pool = self.known[-64:] or [0]
        rm.block_hashes.extend(
            rng.choice(pool) if rng.random() < 0.8 else _hash(rng) for _ in range(n)
        )
        tier, level, locality = _tier(rng), _level(rng), _locality(rng)
        if tier is not None:
            rm.tier = tier
        if level is not None:
            rm.cache_level = level
        if locality is not None:
            rm.locality = locality
        if rng.random() < 0.2:
            rm.medium = "GPU"
        if rng.random() < 0.2:
            rm.group_idx = 1
        if rng.random() < 0.2:
            rm.ownership = "engine"
        tier_ok = tier is None or 0 <= tier <= 4
        level_ok = level is None or level >= 0
        locality_ok = locality is None or locality >= 0
        return "removed" if tier_ok and level_ok and locality_ok else "index"

    def batch(self, n_events: int) -> tuple[common_pb2.KvEventBatch, list[str]]:
        rng = self.rng
        batch = common_pb2.KvEventBatch(sequence_number=rng.randrange(2**40))
        if rng.random() < 0.5:
            batch.timestamp = rng.random() * 1e9
        if rng.random() < 0.3:
            batch.dp_rank = rng.choice([0, 1, -1])
        if rng.random() < 0.3:
            batch.load.running_requests = 3
            batch.load.token_usage = 0.5
        if rng.random() < 0.2:
            batch.snapshot.index = 1
            batch.snapshot.count = 2
        expected = []
        for i in range(n_events):
            ev = batch.events.add()
            if rng.random() < 0.8:
                ev.event_id = rng.choice([i, 0, 2**64 - 1])
            r = rng.random()
            if r < 0.70:
                expected.append(self.stored(ev))
            elif r < 0.88:
                expected.append(self.removed(ev))
            elif r < 0.95:
                if rng.random() < 0.5:
                    ev.cleared.ownership = "engine"
                else:
                    ev.cleared.SetInParent()
                expected.append("index")
            else:
                expected.append("index")  # no data
        return batch, expected


def classify(items: list[Any], batch: common_pb2.KvEventBatch) -> list[str]:
    """The per-event classification of `parse_events` output for `batch` (checks int
    indices, and that a run holds one tuple per block of the events it covers)."""
    out: list[str] = []
    for item in items:
        if type(item) is list:
            assert item, "empty run"
            covered = 0
            while covered < len(item):
                covered += len(batch.events[len(out)].stored.blocks)
                out.append("fast")
            assert covered == len(item)
        elif type(item) is tuple:
            out.append("removed")
        else:
            assert type(item) is int and item == len(out)
            out.append("index")
    assert len(out) == len(batch.events)
    # consecutive runs are merged
    for a, b in itertools.pairwise(items):
        assert not (type(a) is list and type(b) is list)
    return out


# ------------------------------------------------------------------ (a) equivalence


@needs_native
def test_random_batches_feed_the_same_calls() -> None:
    """~3,000 random events: same sink calls and counts; the reader takes what it can."""
    assert _kvwire is not None
    gen = Gen(seed=20240601)
    seen = {"fast": 0, "removed": 0, "index": 0}
    for _ in range(150):
        batch, expected = gen.batch(gen.rng.randint(0, 40))
        items = _kvwire.parse_events(batch.SerializeToString())
        assert classify(items, batch) == expected
        for kind in expected:
            seen[kind] += 1
        sink, counts = run_both(batch)
        from_bytes = check_bytes(batch.SerializeToString())
        assert from_bytes is not None
        assert from_bytes[0].calls == sink.calls and from_bytes[1] == counts
    assert seen["fast"] > 800 and seen["removed"] > 300 and seen["index"] > 500, seen


@needs_native
def test_random_batches_build_the_same_index() -> None:
    """Real indexes fed natively (a parsed batch, and its wire bytes) and in Python (the
    message, and the bytes through the fallback) end up identical."""
    gen = Gen(seed=7)
    native, python, wire, wire_python = (PrefixIndex(BS) for _ in range(4))
    for i in range(120):
        batch, _ = gen.batch(gen.rng.randint(1, 40))
        worker = f"w{i % 3}"
        raw = batch.SerializeToString()
        want = ingest_batch_python(batch, python, worker)
        assert ingest_batch(batch, native, worker) == want
        assert ingest_decoded(decode_batch(raw), wire, worker) == want
        with pure_python():
            assert ingest_decoded(decode_batch(raw), wire_python, worker) == want
    for other in (native, wire, wire_python):
        assert other._holders == python._holders
        assert list(other._holders) == list(python._holders)  # LRU order too
        assert other._eng == python._eng
        assert other._host == python._host
        assert other._shared == python._shared
        assert other.stats == python.stats
    assert native.num_blocks > 100


@needs_native
def test_fast_values() -> None:
    """The fast shape's tuple values: signed hashes, parent None, uint32-LE bytes, tier."""
    assert _kvwire is not None
    batch = common_pb2.KvEventBatch()
    st = batch.events.add(event_id=1).stored
    st.blocks.add(block_hash=-1, token_ids=[0, U32, 1, 2**31])
    st = batch.events.add(event_id=2).stored
    st.blocks.add(block_hash=I64_MIN, token_ids=[5], cache_level=2)
    st.parent_block_hash = -1
    st = batch.events.add(event_id=3).stored
    st.blocks.add(block_hash=I64_MAX, token_ids=[], cache_level=2)
    st.parent_block_hash = 0
    st.tier = common_pb2.KV_CACHE_TIER_DISK
    tokens = (0).to_bytes(4, "little") + U32.to_bytes(4, "little") + (1).to_bytes(4, "little")
    assert _kvwire.parse_events(batch.SerializeToString()) == [
        [
            (-1, None, tokens + (2**31).to_bytes(4, "little"), 1),
            (I64_MIN, -1, (5).to_bytes(4, "little"), 3),
            (I64_MAX, 0, b"", 3),
        ]
    ]
    run_both(batch)


@needs_native
def test_a_run_of_pages_reads_as_chained_blocks() -> None:
    """A stored event of three blocks (SGLang's radix node): one tuple per block, the first
    with the event's parent, each later one with the block before it; the tier from the
    event, else the first block's cache_level; the next event's blocks join the same run."""
    assert _kvwire is not None
    batch = common_pb2.KvEventBatch()
    st = batch.events.add(event_id=1).stored
    st.parent_block_hash = 7
    for h, t in ((11, 1), (12, 2), (13, 3)):
        st.blocks.add(block_hash=h, token_ids=[t, t], cache_level=1 if h == 11 else 0)
    st = batch.events.add(event_id=2).stored
    st.blocks.add(block_hash=21, token_ids=[9])
    st.blocks.add(block_hash=22, token_ids=[8])
    st.tier = common_pb2.KV_CACHE_TIER_DEVICE

    def u32(*ids: int) -> bytes:
        return b"".join(i.to_bytes(4, "little") for i in ids)

    assert _kvwire.parse_events(batch.SerializeToString()) == [
        [
            (11, 7, u32(1, 1), 2),
            (12, 11, u32(2, 2), 2),
            (13, 12, u32(3, 3), 2),
            (21, None, u32(9), 1),
            (22, 21, u32(8), 1),
        ]
    ]
    run_both(batch)


@needs_native
def test_removed_values() -> None:
    """Removed events: hashes as a list, tier (cache_level + 1 fallback) or None, shared."""
    assert _kvwire is not None
    batch = common_pb2.KvEventBatch()
    batch.events.add().removed.block_hashes.extend([1, -1, I64_MIN])
    rm = batch.events.add().removed
    rm.cache_level = 0
    rm.locality = common_pb2.KV_CACHE_LOCALITY_REMOTE
    rm = batch.events.add().removed
    rm.tier = common_pb2.KV_CACHE_TIER_UNSPECIFIED
    rm.cache_level = 1
    rm.block_hashes.append(7)
    rm = batch.events.add().removed
    rm.tier = common_pb2.KV_CACHE_TIER_EXTERNAL
    rm.cache_level = 1
    rm.locality = common_pb2.KV_CACHE_LOCALITY_LOCAL
    assert _kvwire.parse_events(batch.SerializeToString()) == [
        ([1, -1, I64_MIN], None, False),
        ([], 1, True),
        ([7], 2, False),
        ([], 4, False),
    ]
    run_both(batch)


@needs_native
def test_a_python_read_fast_event_joins_the_run() -> None:
    """An event the reader leaves to Python (tier 7) but Python reads as the fast shape
    stays in the same `store_blocks` run as its neighbours."""
    batch = common_pb2.KvEventBatch()
    for i, tier in enumerate([1, 7, 1]):
        st = batch.events.add().stored
        st.blocks.add(block_hash=i, token_ids=[i] * BS)
        st.tier = tier
    assert _kvwire is not None
    items = _kvwire.parse_events(batch.SerializeToString())
    assert [type(x) for x in items] == [list, int, list]
    sink, counts = run_both(batch)
    assert [c[0] for c in sink.calls] == ["store"]
    assert counts == BatchCounts(stored=3)


# ------------------------------------------------------------------ wire encoding helpers


def varint(v: int) -> bytes:
    v &= 2**64 - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(field: int, wt: int) -> bytes:
    return varint(field << 3 | wt)


def fv(field: int, v: int) -> bytes:
    """A varint field."""
    return tag(field, 0) + varint(v)


def fl(field: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag(field, 2) + varint(len(payload)) + payload


def event_stored(stored: bytes) -> bytes:
    return fl(3, fl(2, stored))


UNKNOWN = (
    fv(99, 5)
    + fl(100, b"unknown!")
    + tag(101, 5)
    + b"\x00\x00\x00\x00"
    + tag(102, 1)
    + b"\x00" * 8
    + tag(103, 3)
    + fv(1, 1)
    + tag(104, 3)
    + tag(104, 4)
    + tag(103, 4)
    + fv(2**29 - 1, 1)
)


# ------------------------------------------------------------------ (b) unknown fields


@needs_native
def test_unknown_fields_are_skipped_at_every_level() -> None:
    """Unknown fields (every wire type, nested groups) in the batch, an event, a stored
    event, a block and a removed event change nothing."""
    assert _kvwire is not None
    batch = common_pb2.KvEventBatch(sequence_number=3)
    st = batch.events.add(event_id=1).stored
    st.parent_block_hash = 9
    st.blocks.add(block_hash=10, token_ids=list(range(BS)), cache_level=1)
    batch.events.add(event_id=2).removed.block_hashes.extend([10, -3])
    batch.events.add(event_id=3).cleared.SetInParent()
    plain = _kvwire.parse_events(batch.SerializeToString())
    assert [type(x) for x in plain] == [list, tuple, int]

    appended = batch.SerializeToString() + UNKNOWN
    assert _kvwire.parse_events(appended) == plain
    assert _kvwire.parse_events(UNKNOWN + batch.SerializeToString()) == plain

    # nested: upb keeps unknown fields of each message and writes them back out
    nested = common_pb2.KvEventBatch()
    nested.CopyFrom(batch)
    ev0, ev1 = nested.events[0], nested.events[1]
    ev0.stored.blocks[0].MergeFromString(UNKNOWN)
    ev0.stored.MergeFromString(UNKNOWN)
    ev0.MergeFromString(UNKNOWN)
    ev1.removed.MergeFromString(UNKNOWN)
    nested.MergeFromString(UNKNOWN)
    raw = nested.SerializeToString()
    assert raw.count(b"unknown!") == 5
    assert _kvwire.parse_events(raw) == plain
    run_both(nested)


@needs_native
def test_unpacked_and_split_repeated_scalars() -> None:
    """token_ids and block_hashes unpacked, packed in two chunks, or mixed: same items."""
    assert _kvwire is not None
    tokens = [0, 1, 300, U32]
    packed = b"".join(varint(t) for t in tokens)
    block_variants = [
        fv(1, -5) + fl(2, packed),
        fv(1, -5) + b"".join(fv(2, t) for t in tokens),
        fv(1, -5) + fl(2, packed[:1]) + fl(2, packed[1:]),
        fv(2, tokens[0]) + fl(2, packed[1:]) + fv(1, -5),
    ]
    hashes = [3, -(2**63), -1]
    removed_variants = [
        fl(1, b"".join(varint(h) for h in hashes)),
        b"".join(fv(1, h) for h in hashes),
        fv(1, hashes[0]) + fl(1, b"".join(varint(h) for h in hashes[1:])),
    ]
    want_tokens = b"".join(t.to_bytes(4, "little") for t in tokens)
    for block in block_variants:
        for removed in removed_variants:
            raw = event_stored(fl(1, block)) + fl(3, fl(3, removed))
            assert _kvwire.parse_events(raw) == [
                [(-5, None, want_tokens, 1)],
                (hashes, None, False),
            ]
            native, python = RecordingSink(), RecordingSink()
            batch = common_pb2.KvEventBatch.FromString(raw)
            assert ingest_raw(raw, native) == ingest_batch_python(batch, python, "w")
            assert native.calls == python.calls


# the reader hands these back to Python (bytes upb accepts, values it would truncate or
# merge, wire types the schema does not give): (stored payload, reason)
DOUBTFUL_STORED = [
    (fl(1, fv(1, 1) + fv(1, 2)), "block_hash twice"),
    (fl(1, fv(1, 1)) + fl(1, fv(1, 2) + fv(4, 0)), "the second block's lora_id"),
    (fl(1, fv(1, 1)) + fl(1, fv(1, 2) + fv(2, 2**32)), "the second block's token above uint32"),
    (fl(1, fv(1, 1) + fv(2, 2**32)), "token id above uint32"),
    (fl(1, fv(1, 1) + fl(2, varint(2**40))), "packed token id above uint32"),
    (fl(1, fv(1, 1) + fv(5, 1) + fv(5, 2)), "cache_level twice"),
    (fl(1, fv(1, 1) + fv(5, 2**32 + 1)), "cache_level truncated by upb"),
    (fl(1, fv(1, 1) + fv(5, -1)), "negative cache_level"),
    (fl(1, fv(1, 1) + fv(4, 0)), "lora_id 0"),
    (fl(1, fv(1, 1) + fl(6, b"")), "empty extra key"),
    (fl(1, fl(1, b"")), "block_hash as bytes"),
    (fl(1, fv(1, 1) + tag(2, 5) + b"\0\0\0\0"), "token id as fixed32"),
    (fl(1, fv(1, 1)) + fv(2, 1) + fv(2, 2), "parent twice"),
    (fl(1, fv(1, 1)) + fv(3, 2**32 + 2), "tier truncated by upb"),
    (fl(1, fv(1, 1)) + fv(3, 1) + fv(3, 2), "tier twice"),
    (fl(1, fv(1, 1)) + fv(3, 5), "unnamed tier"),
    (fl(1, fv(1, 1)) + fv(3, -1), "negative tier"),
    (fl(1, fv(1, 1)) + fv(7, 2**32), "sliding window truncated to 0 by upb"),
    (fl(1, fv(1, 1)) + fv(8, 2**32 + 2), "locality truncated to REMOTE by upb"),
    (fl(1, fv(1, 1)) + fv(8, -1), "negative locality"),
    (fl(1, fv(1, 1)) + fv(8, 0) + fv(8, 1), "locality twice"),
    (fl(1, fv(1, 1)) + fv(6, 1), "spec kind as varint"),
    (fl(1, fv(1, 1)) + fv(11, 1), "lora_name as varint"),
    (fl(1, fv(1, 1)) + tag(2, 1) + b"\0" * 8, "parent as fixed64"),
    (fl(1, fv(1, 1)) + fl(5, b""), "group_idx as bytes"),
    (fv(1, 1), "blocks as varint"),
    (b"", "no blocks"),
]

DOUBTFUL_REMOVED = [
    (fv(3, 1) + fv(3, 2), "tier twice"),
    (fv(3, 9), "unnamed tier"),
    (fv(2, -1), "negative cache_level"),
    (fv(2, 2**32), "cache_level truncated by upb"),
    (fv(6, 2**32 + 2), "locality truncated by upb"),
    (fv(6, 2) + fv(6, 2), "locality twice"),
    (tag(1, 1) + b"\0" * 8, "hash as fixed64"),
    (fl(4, b"") + fv(4, 1), "medium as varint"),
]

DOUBTFUL_EVENTS = [
    (fl(2, fl(1, fv(1, 1))) + fl(3, b""), "stored then removed"),
    (fl(2, fl(1, fv(1, 1))) + fl(2, fv(3, 2)), "stored twice (upb merges)"),
    (fl(3, b"") + fl(3, b""), "removed twice"),
    (fl(4, b""), "cleared"),
    (fv(1, 3), "no data"),
    (b"", "empty"),
    (fv(2, 1), "stored as varint"),
    (fl(1, b"") + fl(2, fl(1, fv(1, 1))), "event_id as bytes"),
]


@needs_native
@pytest.mark.parametrize(
    "event",
    [pytest.param(fl(2, s), id="stored: " + why) for s, why in DOUBTFUL_STORED]
    + [pytest.param(fl(3, r), id="removed: " + why) for r, why in DOUBTFUL_REMOVED]
    + [pytest.param(e, id="event: " + why) for e, why in DOUBTFUL_EVENTS],
)
def test_doubtful_events_go_back_to_python(event: bytes) -> None:
    """Each event the reader is not certain of comes back as its index, between two fast
    events, and the result is what the Python path makes of upb's parse."""
    assert _kvwire is not None
    fast = event_stored(fl(1, fv(1, 1) + fl(2, varint(7))))
    raw = fast + fl(3, event) + fast
    items = _kvwire.parse_events(raw)
    assert [type(x) for x in items] == [list, int, list] and items[1] == 1
    native, python = RecordingSink(), RecordingSink()
    batch = common_pb2.KvEventBatch.FromString(raw)
    assert ingest_raw(raw, native) == ingest_batch_python(batch, python, "w")
    assert native.calls == python.calls


# ------------------------------------------------------------------ (c) malformed bytes


@needs_native
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x08", "truncated varint at byte 1"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "varint longer than 10 bytes at byte 1"),
        (b"\x1a\x05ab", "length-delimited field runs past the end at byte 1"),
        (b"\x1a\x03" + b"\x12\x05ab", "length-delimited field runs past the end at byte 3"),
        (b"\x1a\x06\x12\x04\x0a\x02\x08\x80", "truncated varint at byte 7"),
        (b"\x11\x00\x00", "truncated fixed64 at byte 1"),
        (b"\x15\x00", "truncated fixed32 at byte 1"),
        (b"\x0f", "invalid wire type at byte 1"),
        (b"\x00", "field number 0 at byte 0"),
        (b"\x0c", "unexpected end-group at byte 1"),
        (b"\x0b", "unterminated group at byte 1"),
        (b"\x0b\x14", "mismatched end-group at byte 1"),
        (b"\x80\x80\x80\x80\x80\x02", "tag out of range at byte 0"),
        (b"\x1b" * 101 + b"\x1c" * 101, "groups nested too deep at byte 101"),
    ],
)
def test_malformed_bytes_raise(raw: bytes, message: str) -> None:
    """Bytes that are no protobuf message raise ValueError naming what and where; upb
    rejects them too."""
    assert _kvwire is not None
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        _kvwire.parse_events(raw)
    assert MALFORMED.match(str(info.value))
    assert str(info.value) == f"malformed KvEventBatch: {message}"
    with pytest.raises(DecodeError):
        common_pb2.KvEventBatch.FromString(raw)
    assert decode_both(raw) is None


def _sample_batch() -> bytes:
    gen = Gen(seed=99)
    batch, _ = gen.batch(12)
    batch.load.running_requests = 2
    batch.snapshot.count = 3
    return batch.SerializeToString() + UNKNOWN


@needs_native
def test_every_truncation() -> None:
    """Every prefix of a real batch: ValueError exactly where upb fails to parse, else the
    same sink calls as the Python path on upb's parse."""
    assert _kvwire is not None
    raw = _sample_batch()
    assert len(raw) > 300
    failures = 0
    for n in range(len(raw)):
        cut = raw[:n]
        try:
            batch = common_pb2.KvEventBatch.FromString(cut)
        except DecodeError:
            batch = None
        if batch is None:
            with pytest.raises(ValueError) as info:
                _kvwire.parse_events(cut)
            assert MALFORMED.match(str(info.value))
            assert decode_both(cut) is None
            failures += 1
            continue
        native, python = RecordingSink(), RecordingSink()
        assert ingest_raw(cut, native) == ingest_batch_python(batch, python, "w")
        assert native.calls == python.calls
    assert failures > len(raw) // 2


@needs_native
def test_random_corruption_never_crashes() -> None:
    """Random byte flips: a list or ValueError; where upb parses the bytes, the reader does
    too and feeds the same calls."""
    assert _kvwire is not None
    raw = _sample_batch()
    rng = random.Random(5)
    parsed = 0
    for _ in range(1500):
        buf = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        cut = (
            bytes(buf[: rng.randint(len(buf) // 2, len(buf))]) if rng.random() < 0.2 else bytes(buf)
        )
        try:
            batch = common_pb2.KvEventBatch.FromString(cut)
        except DecodeError:
            try:
                _kvwire.parse_events(cut)
            except ValueError as err:
                assert MALFORMED.match(str(err))
            assert decode_both(cut) is None
            continue
        parsed += 1
        native, python = RecordingSink(), RecordingSink()
        assert ingest_raw(cut, native) == ingest_batch_python(batch, python, "w")
        assert native.calls == python.calls
    assert parsed > 100


@needs_native
@pytest.mark.parametrize(
    "raw",
    [
        b"\x4b\x00\x00\x4c",  # field number 0 inside an unknown group
        b"\x4b\x03\x04\x4c",  # an empty group numbered 0 inside one
        b"\x1b" * 100 + b"\x1c" * 100,  # 100 nested groups: upb's limit
        b"\x08" + b"\xff" * 9 + b"\x7f",  # a 10-byte varint whose last byte overflows
    ],
)
def test_accepts_what_upb_accepts(raw: bytes) -> None:
    """Corners of the wire format upb parses: the reader parses them too."""
    assert _kvwire is not None
    common_pb2.KvEventBatch.FromString(raw)
    assert _kvwire.parse_events(raw) == []


@needs_native
def test_rejects_non_buffers() -> None:
    assert _kvwire is not None
    with pytest.raises(TypeError):
        _kvwire.parse_events("text")  # type: ignore[arg-type]
    assert _kvwire.parse_events(b"") == []
    assert _kvwire.parse_events(memoryview(b"\x08\x01")) == []


# ------------------------------------------------------------------ (d) the wire bytes


def fd(field: int, v: float) -> bytes:
    """A double field."""
    return tag(field, 1) + struct.pack("<d", v)


FAST_EVENT = event_stored(fl(1, fv(1, 1) + fl(2, varint(7))))
CLEARED_EVENT = fl(3, fl(4, b""))


@needs_native
def test_parse_batch_splits_header_events_and_python_events() -> None:
    """`parse_batch`: the non-event fields' bytes as they were, the event count, and each
    event left to Python as the bytes of its whole field."""
    assert _kvwire is not None
    head, tail = fv(1, 9) + fd(2, 1.5), fv(4, 1) + fl(8, fv(1, 3))
    raw = head + FAST_EVENT + CLEARED_EVENT + tail
    header, count, items = _kvwire.parse_batch(raw)
    assert header == head + tail
    assert count == 2
    assert items == [[(1, None, (7).to_bytes(4, "little"), 1)], CLEARED_EVENT]
    assert _kvwire.parse_batch(b"") == (b"", 0, [])


@needs_native
@pytest.mark.parametrize(
    ("head", "want"),
    [
        (fv(1, 5) + fv(1, 7), (7, 0.0, None, None)),  # the last value wins
        (fl(1, b"x") + fv(2, 3) + fv(4, 1) + fl(4, b""), (0, 0.0, 1, None)),  # wire type
        (fv(4, 2**32 - 1), (0, 0.0, -1, None)),  # int32 from a 64-bit varint
        (fv(4, 2**32), (0, 0.0, 0, None)),
        (fd(2, 2.5) + fd(2, -1.0), (0, -1.0, None, None)),
        (fl(8, fv(1, 5)) + fl(8, fv(2, 7)), (0, 0.0, None, (5, 7))),  # the loads merge
        (fl(8, b"") + fv(8, 1), (0, 0.0, None, (0, 0))),
        (fl(7, fv(1, 1) + fv(2, 2)) + UNKNOWN, (0, 0.0, None, None)),
    ],
)
def test_header_reads_as_upb_reads_it(head: bytes, want: tuple[Any, ...]) -> None:
    """Repeated fields, fields of an unexpected wire type, out-of-range values and unknown
    fields, before or after the events: the header as upb parses the whole batch."""
    for raw in (head + FAST_EVENT + CLEARED_EVENT, FAST_EVENT + head + CLEARED_EVENT):
        assert check_bytes(raw) is not None
        batch = decode_batch(raw)
        h = batch.header
        got = (
            h.sequence_number,
            h.timestamp,
            h.dp_rank if h.HasField("dp_rank") else None,
            (h.load.running_requests, h.load.waiting_requests) if h.HasField("load") else None,
        )
        assert got == want
        assert batch.num_events == 2


BAD_UTF8 = b"G\xffU"


@needs_native
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(event_stored(fl(1, fv(1, 1)) + fl(4, BAD_UTF8)), id="stored medium"),
        pytest.param(event_stored(fl(1, fv(1, 1)) + fl(9, b"\xc0\x80")), id="overlong"),
        pytest.param(event_stored(fl(1, fv(1, 1)) + fl(10, b"\xed\xa0\x80")), id="surrogate"),
        pytest.param(event_stored(fl(1, fv(1, 1)) + fl(4, b"\xf4\x90\x80\x80")), id="> U+10FFFF"),
        pytest.param(event_stored(fl(1, fv(1, 1)) + fl(4, b"\xe2\x82")), id="cut sequence"),
        pytest.param(fl(3, fl(3, fv(1, 1) + fl(7, BAD_UTF8))), id="removed ownership"),
        pytest.param(fl(3, fl(4, fl(1, BAD_UTF8))), id="cleared (an event Python reads)"),
        pytest.param(fl(3, fl(2, fl(11, BAD_UTF8))), id="lora_name (Python reads it)"),
        pytest.param(fl(3, fl(4, fv(1, 1) + b"\x08")), id="truncated in a Python event"),
        pytest.param(fl(8, fv(1, 1) + b"\x08"), id="truncated in the load"),
        pytest.param(fl(8, fl(13, b"\x08")), id="truncated in the load's memory"),
        pytest.param(fl(7, b"\x08"), id="truncated in the snapshot"),
        pytest.param(fl(7, b"\x00"), id="field 0 in the snapshot"),
        pytest.param(event_stored(fl(1, fv(1, 1) + b"\x4b" * 98 + b"\x4c" * 98)), id="block"),
        pytest.param(fl(3, b"\x4b" * 100 + b"\x4c" * 100), id="groups in an event"),
        pytest.param(fl(3, fl(4, b"\x4b" * 99 + b"\x4c" * 99)), id="groups in a cleared"),
        pytest.param(fl(8, b"\x4b" * 100 + b"\x4c" * 100), id="groups in the load"),
        pytest.param(fl(7, b"\x4b" * 100 + b"\x4c" * 100), id="groups in the snapshot"),
    ],
)
def test_bytes_upb_rejects_raise_where_the_reader_does_not_look(raw: bytes) -> None:
    """Invalid UTF-8 in a string, malformed bytes inside an event left to Python, the load
    or the snapshot, groups nested past upb's limit at their depth: `decode_batch` raises
    ValueError natively and in pure Python, before anything is applied."""
    assert decode_both(FAST_EVENT + raw) is None


@needs_native
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(event_stored(fl(1, fv(1, 1)) + fl(4, "hôte-😀".encode())), id="utf-8"),
        pytest.param(event_stored(fl(1, fv(1, 1) + b"\x4b" * 97 + b"\x4c" * 97)), id="block"),
        pytest.param(fl(3, b"\x4b" * 99 + b"\x4c" * 99), id="groups in an event"),
        pytest.param(fl(3, fl(4, b"\x4b" * 98 + b"\x4c" * 98)), id="groups in a cleared"),
        pytest.param(fl(8, b"\x4b" * 99 + b"\x4c" * 99), id="groups in the load"),
        pytest.param(b"\x4b" * 100 + b"\x4c" * 100, id="groups in the batch"),
    ],
)
def test_bytes_upb_accepts_at_the_limits_decode(raw: bytes) -> None:
    """Multibyte UTF-8, and groups nested to upb's limit at each depth: decoded alike."""
    assert check_bytes(FAST_EVENT + raw) is not None


@needs_native
def test_decoding_a_parsed_batch_feeds_what_ingest_batch_feeds() -> None:
    """The bytes of a batch, decoded, make the calls its parsed message makes, whatever
    mix of fast, removed and Python-read events (here tier 7 joins the fast run)."""
    batch = common_pb2.KvEventBatch(sequence_number=4, dp_rank=1)
    batch.load.running_requests = 2
    for i, tier in enumerate([1, 7, 1]):
        st = batch.events.add().stored
        st.blocks.add(block_hash=i, token_ids=[i] * BS)
        st.tier = tier
    batch.events.add().removed.block_hashes.append(1)
    batch.events.add().cleared.SetInParent()
    sink, counts = run_both(batch)
    from_bytes = check_bytes(batch.SerializeToString())
    assert from_bytes is not None
    assert from_bytes[0].calls == sink.calls and from_bytes[1] == counts
    assert [c[0] for c in sink.calls] == ["store", "remove", "apply"]


def test_pure_python_decode_reads_the_whole_message() -> None:
    """Without the extension `decode_batch` is upb's parse: the header is the message and
    DecodeError becomes ValueError."""
    batch = common_pb2.KvEventBatch(sequence_number=3, timestamp=2.0)
    batch.events.add().cleared.SetInParent()
    with pure_python():
        decoded = decode_batch(batch.SerializeToString())
        with pytest.raises(ValueError, match=r"^malformed KvEventBatch: "):
            decode_batch(b"\x08")
    assert decoded.header.sequence_number == 3 and decoded.num_events == 1
    sink = RecordingSink()
    assert ingest_decoded(decoded, sink, "w") == BatchCounts(cleared=1)


def test_a_run_with_a_namespaced_block_goes_the_slow_way_and_keeps_the_run_before_it() -> None:
    """A one-block event joins the run; the next event, a run of pages whose second block
    has a lora_id, is taken back out of it and applied whole as `event_from_proto` reads it:
    the index holds what the plain events path builds, and the first event's block too."""
    batch = common_pb2.KvEventBatch(sequence_number=1)
    tokens = list(range(100, 100 + 3 * BS))
    first = batch.events.add(event_id=1).stored
    first.blocks.add(block_hash=11, token_ids=tokens[:BS])
    rest = batch.events.add(event_id=2).stored
    rest.parent_block_hash = 11
    rest.blocks.add(block_hash=12, token_ids=tokens[BS : 2 * BS])
    rest.blocks.add(block_hash=13, token_ids=tokens[2 * BS :], lora_id=5)
    wire, plain = PrefixIndex(BS), PrefixIndex(BS)
    counts = ingest_batch_python(batch, wire, "w0")
    events.ingest_events(events.events_from_batch(batch), plain, "w0")
    assert counts.stored == 3
    assert wire.match(tokens) == plain.match(tokens) == {"w0": 3 * BS}
    assert wire.match(tokens[:BS]) == {"w0": BS}


@needs_native
@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(fl(1, fv(1, 1) + fv(2, 5)) + fl(1, fv(1, 2) + fv(5, -1)), id="later_level"),
        pytest.param(fl(1, fv(1, 1)) + fl(1, fv(1, 2) + fl(6, b"")), id="later_extra_key"),
        pytest.param(fl(1, fv(1, 1)) + fl(1, fv(1, 2)) + fv(2, 9) + fv(3, 2), id="scalars_after"),
        pytest.param(fl(1, fv(1, 1)) + fl(1, b"") + fl(1, fv(1, 3)), id="empty_middle_block"),
        pytest.param(fl(1, fv(1, 1)) + fv(7, 0) + fl(1, fv(1, 2)), id="scalar_between"),
    ],
)
def test_odd_runs_of_pages_feed_the_calls_python_makes(stored: bytes) -> None:
    """Runs whose later blocks or fields sit oddly: native and Python make the same calls
    (the reader takes the run or hands it back, never something else)."""
    sink = RecordingSink()
    ingest_raw(fl(3, fl(2, stored)), sink)
