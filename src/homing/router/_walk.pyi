"""The affinity index's block keys and prefix walk in C (src/homing/router/_native/walk.c).

Same results as the pure-Python `homing.router.hashing.iter_block_hashes` and
`homing.router.index.PrefixIndex._walk_python` (tests/unit/router/test_router_native.py).
"""

from collections.abc import Sequence

def block_keys(token_ids: Sequence[int], block_size: int, parent: int) -> list[int]:
    """Chained 60-bit keys of every full block of `token_ids` (`block_size` tokens each)
    from `parent`: `XXH3_64(uint32-LE ids, seed=previous key) & (2**60 - 1)`.

    OverflowError for an id outside [0, 2**32), TypeError for an id that is not an int (an
    object with only `__index__`, such as a numpy integer, is refused, though the
    pure-Python path takes it), ValueError for `block_size` <= 0 or `parent` outside
    [0, 2**64)."""

def walk(
    token_ids: Sequence[int],
    block_size: int,
    root: int,
    holders: dict[int, int],
    live: int,
    clean: bool,
    recent: set[int],
) -> list[tuple[int, int]]:
    """`PrefixIndex.lookup`'s device-tier walk: from `root`, block by block until the first
    key missing from `holders` (key -> slot mask); `(slots that stopped matching, blocks
    matched before)` pairs in walk order, the slots matching to the end last, masks taken
    `& live` unless `clean`. Every matched key is added to `recent`. Empty: no match.
    Errors as `block_keys`, raised before the first lookup (every id of the full blocks is
    checked first); TypeError when `holders` is not exactly a dict or `recent` exactly a
    set."""
