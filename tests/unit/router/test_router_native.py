"""The C prefix walk (`homing.router._walk`) computes what the pure-Python code computes."""

from __future__ import annotations

import random

import pytest

from homing.router import hashing
from homing.router.events import BlocksStored, StoredBlock
from homing.router.hashing import DEFAULT_HASH_SEED, iter_block_hashes, native_walk
from homing.router.index import PrefixIndex

BS = 4


def test_the_extension_is_built() -> None:
    """`make` builds it (setup.py; needs a C compiler and Debian's libxxhash-dev)."""
    assert native_walk is not None, (
        "homing.router._walk is not built: it needs a C compiler and xxhash.h >= 0.8 (Debian: "
        "apt-get install gcc libxxhash-dev); then `make clean && make`"
    )


needs_native = pytest.mark.skipif(native_walk is None, reason="homing.router._walk not built")


@needs_native
@pytest.mark.parametrize("block_size", [1, 3, 16, 32, 64])
def test_block_keys_equal_the_python_chain(block_size: int) -> None:
    """Same keys for ids on both sides of CPython's one-digit limit (2**30) and up to
    2**32 - 1, any length (a trailing partial block is ignored), any parent."""
    rng = random.Random(block_size)
    edges = [0, 1, 2**30 - 1, 2**30, 2**31, 2**32 - 1]
    for length in (0, block_size - 1, block_size, 5 * block_size + 1, 700):
        ids = [
            rng.choice(edges) if rng.random() < 0.2 else rng.randrange(2**17) for _ in range(length)
        ]
        parent = rng.randrange(2**60)
        assert hashing.block_hashes(ids, block_size, parent) == list(
            iter_block_hashes(ids, block_size, parent)
        )


@needs_native
@pytest.mark.parametrize(
    ("bad", "error"),
    [(2**32, OverflowError), (-1, OverflowError), (1.5, TypeError), ("7", TypeError)],
)
def test_bad_token_ids_raise_what_the_python_path_raises(bad: object, error: type) -> None:
    ids = [1, 2, 3, bad]
    with pytest.raises(error):
        hashing.block_hashes(ids, 4, DEFAULT_HASH_SEED)
    with pytest.raises(error):
        list(iter_block_hashes(ids, 4, DEFAULT_HASH_SEED))  # type: ignore[arg-type]


def _store(index: PrefixIndex, worker: str, tokens: list[int], tag: str) -> None:
    blocks = tuple(
        StoredBlock(
            engine_hash=hash((tag, worker, i)), token_ids=tuple(tokens[i * BS : (i + 1) * BS])
        )
        for i in range(len(tokens) // BS)
    )
    index.apply(worker, BlocksStored(blocks=blocks))


@needs_native
def test_walk_equals_the_python_walk_on_a_random_index() -> None:
    """Random branching conversations on 12 workers, some flushed (retired slots, so the
    walk must mask by `live`), some credited by approximate records: for every probe the
    (slots, depth) drops and the recently-used marks are identical."""
    rng = random.Random(7)
    index = PrefixIndex(BS, max_blocks=100_000)
    trunks = [[rng.randrange(50_000) for _ in range(BS * 24)] for _ in range(6)]
    workers = [f"w{i}" for i in range(12)]
    for step in range(400):
        trunk = rng.choice(trunks)
        cut = rng.randrange(1, len(trunk) // BS) * BS
        tokens = trunk[:cut] + [rng.randrange(50_000) for _ in range(BS * rng.randrange(0, 6))]
        worker = rng.choice(workers)
        if rng.random() < 0.1:
            index.record_approximate(f"a{step % 3}", tokens, now=0.0)
        else:
            _store(index, worker, tokens, f"s{step}")
        if rng.random() < 0.03:
            index.flush_worker(rng.choice(workers))
    assert index._dead | index._sweeping, "scenario must leave retired slots to mask"
    probes = 0
    for _ in range(300):
        trunk = rng.choice(trunks)
        tokens = trunk[: rng.randrange(0, len(trunk))] + [rng.randrange(50_000) for _ in range(7)]
        n = len(tokens) // BS
        for clean in (False, True):
            index._recent = set()  # so a missing mark shows
            expected = index._walk_python(tokens, n, clean) if n else []
            recent_py = index._recent
            index._recent = set()
            got = native_walk(
                tokens, BS, index._root, index._holders, index._live, clean, index._recent
            )
            assert got == expected
            assert index._recent == recent_py
            probes += bool(got)
    assert probes > 100  # most probes matched something


@needs_native
def test_lookup_answers_the_same_with_and_without_the_extension(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = PrefixIndex(BS)
    prompt = list(range(100, 100 + 10 * BS))
    _store(index, "w0", prompt, "a")
    _store(index, "w1", prompt[: 4 * BS], "b")
    native = index.lookup(prompt)
    monkeypatch.setattr("homing.router.index.native_walk", None)
    python = index.lookup(prompt)
    assert native.tokens == python.tokens == {"w0": 10 * BS, "w1": 4 * BS}
    assert native.approximate == python.approximate


@needs_native
@pytest.mark.parametrize(("bad", "error"), [(2**32, OverflowError), (1.5, TypeError)])
def test_a_bad_id_past_the_match_raises_and_marks_nothing(
    bad: object, error: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both paths check every id of the full blocks before the first lookup, so a bad id
    raises even where nothing past block 0 matches, and no block is marked used."""
    index = PrefixIndex(BS)
    prompt = list(range(100, 100 + 4 * BS))
    _store(index, "w0", prompt[:BS], "a")
    probe = [*prompt[: 2 * BS], bad, *prompt[2 * BS + 1 :]]
    index._recent = set()
    with pytest.raises(error):
        index.lookup(probe)  # type: ignore[arg-type]
    monkeypatch.setattr("homing.router.index.native_walk", None)
    with pytest.raises(error):
        index.lookup(probe)  # type: ignore[arg-type]
    assert index._recent == set()


@needs_native
def test_hostile_arguments_raise_instead_of_crashing() -> None:
    """Direct calls with objects that run Python code mid-walk (a mask whose == empties the
    dict, a `live` whose & empties the token list) neither crash nor read freed memory."""
    holders: dict[int, object] = {}
    ids = list(range(8 * BS))
    keys = hashing.block_hashes(ids, BS, 5)

    class Mask(int):
        def __eq__(self, other: object) -> bool:
            holders.clear()
            return False

        __hash__ = int.__hash__

    holders.update({k: Mask(1 + (i % 2)) for i, k in enumerate(keys)})
    drops = native_walk(ids, BS, 5, holders, 3, True, set())
    assert isinstance(drops, list)

    class Live(int):
        def __rand__(self, other: int) -> int:
            ids.clear()
            return other

    holders2 = dict.fromkeys(keys, 1)
    assert native_walk(ids, BS, 5, holders2, Live(1), False, set()) == [(1, 8)]
    assert ids == []  # emptied mid-walk; the walk had converted the ids before
    ids = list(range(8 * BS))
    assert hashing.block_hashes(ids, 2**62, 5) == []  # no allocation for zero blocks
    with pytest.raises(ValueError, match="block_size must be positive"):
        hashing.block_hashes(ids, 0, 5)
    with pytest.raises(ValueError, match="parent must be an int"):
        hashing.block_hashes(ids, BS, -1)


@needs_native
def test_walk_refuses_dict_and_set_subclasses() -> None:
    """Subclasses would have their overrides bypassed (the walk reads and writes the
    objects directly), so they are refused."""

    class Holders(dict):  # type: ignore[type-arg]
        pass

    class Recent(set):  # type: ignore[type-arg]
        pass

    ids = list(range(4 * BS))
    with pytest.raises(TypeError, match="holders: dict and recent: set"):
        native_walk(ids, BS, 5, Holders(), 1, True, set())
    with pytest.raises(TypeError, match="holders: dict and recent: set"):
        native_walk(ids, BS, 5, {}, 1, True, Recent())
