"""The router's own block hash: xxh3-64 chained over `block_size` token ids, kept to 60 bits.

Rule of this file: a block's key depends on every token before it. Block i's key is
`xxh3_64(uint32-LE bytes of its block_size token ids, seed = key of block i-1) & (2**60 - 1)`,
and block 0 is seeded with the namespace root (`root_hash`). Only full blocks are hashed (a
radix cache holds whole pages only), so a prompt of n tokens has `n // block_size` keys. The
engine's own block hash (SGLang: SHA-256 chain) is never reproduced here; the index maps it
to ours.

Native code: `homing.router._walk` (src/homing/router/_native/walk.c, built by setup.py
against xxHash's own libxxhash) computes the same keys (`block_hashes`) and the index's
prefix walk (`native_walk`, None where the extension was not built) without a Python call
per block; tests check both paths give equal results.

Why 60 bits: CPython stores an int below 2**60 in 32 bytes and one above in 36; the index
holds one key object per block, so 60 bits saves 4 bytes a block. The chance that two of
10**7 distinct blocks share a key is about (10**7)**2 / 2**61 ~ 4e-5.
"""

from __future__ import annotations

import sys
import warnings
from array import array
from collections.abc import Iterator, Sequence

import xxhash

try:  # the C extension (setup.py); same results, ~6x faster
    from homing.router._walk import block_keys as _native_block_keys
    from homing.router._walk import walk as native_walk
except ImportError:  # pragma: no cover - built by `make`; pure Python elsewhere
    _native_block_keys = None
    native_walk = None

#: Default seed of the chain root: the ASCII bytes "homing" as an integer (any fixed
#: 60-bit value works; it only has to be the same for events and lookups).
DEFAULT_HASH_SEED = 0x686F6D696E67

#: Keys (and engine hashes, when used as map keys) are reduced to 60 bits (see above).
KEY_MASK = (1 << 60) - 1

_xxh3 = xxhash.xxh3_64_intdigest


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as uint32 little-endian bytes (OverflowError for ids outside uint32)."""
    arr = array("I", token_ids)
    if arr.itemsize != 4:  # pragma: no cover - platforms where C unsigned int is not 32 bits
        arr = array("L", token_ids)
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


def root_hash(seed: int = DEFAULT_HASH_SEED, namespace: str = "") -> int:
    """The chain's starting value: `seed`, or `xxh3_64(namespace, seed)` for a namespace.

    A namespace (LoRA adapter, cache salt) gives its blocks a disjoint key space, so a
    request without it never matches them.
    """
    if not namespace:
        return seed & KEY_MASK
    return _xxh3(namespace.encode("utf-8"), seed & KEY_MASK) & KEY_MASK


def chain_hash(parent: int, token_ids: Sequence[int]) -> int:
    """Key of one block given its parent's key (or the root): a 60-bit int."""
    return _xxh3(token_bytes(token_ids), parent) & KEY_MASK


def iter_block_hashes(token_ids: Sequence[int], block_size: int, root: int) -> Iterator[int]:
    """Lazily yield the chained key of each full block of `token_ids`, in order.

    Lazy so that a lookup stops hashing at the first block nobody holds.
    """
    n_blocks = len(token_ids) // block_size
    if n_blocks == 0:
        return
    stride = 4 * block_size
    view = memoryview(token_bytes(token_ids[: n_blocks * block_size]))
    h = root
    for i in range(n_blocks):
        h = _xxh3(view[i * stride : (i + 1) * stride], h) & KEY_MASK
        yield h


def block_hashes(token_ids: Sequence[int], block_size: int, root: int) -> list[int]:
    """All full-block keys of `token_ids` (see `iter_block_hashes`); OverflowError for an
    id outside uint32, TypeError for a non-int. Uses the C extension when it is built."""
    if _native_block_keys is not None:
        return _native_block_keys(token_ids, block_size, root)
    return list(iter_block_hashes(token_ids, block_size, root))


def _native_agrees() -> bool:
    """The C extension's keys equal the `xxhash` package's on a fixed probe: the two link
    separate builds of xxHash (the system's libxxhash, the package's bundled copy), and
    events are keyed by one while lookups hash with the other."""
    assert _native_block_keys is not None
    probe = [(i * 2_654_435_761) % 2**32 for i in range(40)]  # ids up to 2**32 - 1
    return _native_block_keys(probe, 16, DEFAULT_HASH_SEED) == list(
        iter_block_hashes(probe, 16, DEFAULT_HASH_SEED)
    )


if _native_block_keys is not None and not _native_agrees():  # pragma: no cover
    warnings.warn(
        "homing.router._walk hashes differently from the xxhash package: using pure Python",
        RuntimeWarning,
        stacklevel=1,
    )
    _native_block_keys = None
    native_walk = None
