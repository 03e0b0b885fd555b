"""The router's own block hash: xxh3-64 chained over `block_size` token ids.

Rule of this file: a block's key depends on every token before it. Block i's hash is
`xxh3_64(uint32-LE bytes of its block_size token ids, seed = hash of block i-1)`, and block 0
is seeded with the namespace root (`root_hash`). Only full blocks are hashed (a radix cache
holds whole pages only), so a prompt of n tokens has `n // block_size` keys. The engine's
own block hash (SGLang: SHA-256 chain) is never reproduced here; the index maps it to ours.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Sequence

import xxhash

#: Default seed of the chain root: the ASCII bytes "homing" as an integer (any fixed
#: 64-bit value works; it only has to be the same for events and lookups).
DEFAULT_HASH_SEED = 0x686F6D696E67

_MASK64 = (1 << 64) - 1


def _token_bytes(token_ids: Sequence[int]) -> bytes:
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
        return seed & _MASK64
    return xxhash.xxh3_64_intdigest(namespace.encode("utf-8"), seed=seed & _MASK64)


def chain_hash(parent: int, token_ids: Sequence[int]) -> int:
    """Hash of one block given its parent's hash (or the root): uint64."""
    return xxhash.xxh3_64_intdigest(_token_bytes(token_ids), seed=parent)


def iter_block_hashes(token_ids: Sequence[int], block_size: int, root: int) -> Iterator[int]:
    """Lazily yield the chained hash of each full block of `token_ids`, in order.

    Lazy so that a lookup stops hashing at the first block nobody holds.
    """
    n_blocks = len(token_ids) // block_size
    if n_blocks == 0:
        return
    stride = 4 * block_size
    view = memoryview(_token_bytes(token_ids[: n_blocks * block_size]))
    h = root
    for i in range(n_blocks):
        h = xxhash.xxh3_64_intdigest(view[i * stride : (i + 1) * stride], seed=h)
        yield h


def block_hashes(token_ids: Sequence[int], block_size: int, root: int) -> list[int]:
    """All full-block hashes of `token_ids` (see `iter_block_hashes`)."""
    return list(iter_block_hashes(token_ids, block_size, root))
