"""Trace loaders and prompt construction: a trace row becomes a `TraceRequest`, its prompt a
deterministic list of token ids.

Rule of this file: pure and deterministic. The same file, `limit` and vocabulary range give the
same requests and byte-identical prompts on every machine and Python version, so two benchmark
runs (or two routers) see exactly the same workload. No clock, no global randomness, no env.

Formats (see `../shared/traces/PROVENANCE.md`):

- Mooncake jsonl (kvcache-ai/Mooncake, FAST'25): one JSON object per line with `timestamp`
  (ms since trace start), `input_length` and `output_length` (tokens) and `hash_ids` (one id per
  512-token block of the prompt; equal ids mean identical block content, so shared prefixes are
  visible). `len(hash_ids) == ceil(input_length / 512)`; the last block may be partial.
- Azure LLM inference csv (Azure/AzurePublicDataset, Splitwise ISCA'24): `TIMESTAMP` (wall
  clock, e.g. `2023-11-16 18:17:03.9799600`), `ContextTokens`, `GeneratedTokens`. Lengths and
  arrival times only, no prefix information.

Prompt construction: each Mooncake hash id maps to a fixed pseudo-random block of 512 token ids
derived from the id alone, and the last block is cut so the prompt has exactly `input_length`
tokens; equal ids therefore give identical prefixes and the trace's sharing is exact. An Azure
row gets pseudo-random blocks derived from its row index in a separate namespace, so no two rows
share a prefix. The generator is xxHash3-128 in counter mode (a published, fixed algorithm), so it
does not depend on the stdlib `random` implementation.
"""

from __future__ import annotations

import csv
import json
import math
import struct
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import xxhash

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake hash id (Mooncake FAST'25 trace README: one hash per 512-token block)."""

DEFAULT_VOCAB_LOW = 1000
"""Lowest token id used in synthetic prompts: skips the special and byte-level ids at the start of
common BPE vocabularies (DeepSeek, Llama 3)."""

DEFAULT_VOCAB_LIMIT = 100_000
"""Exclusive upper bound of synthetic token ids: below the served DeepSeek tokenizer's 129,280 and
Llama 3's 128,256 vocabularies and below their special tokens (>= 128,000)."""

TraceFormat = Literal["mooncake", "azure"]

_NS_MOONCAKE = 0x4D4F4F4E  # xxh3 seed for Mooncake blocks ("MOON")
_NS_AZURE = 0x415A5552  # xxh3 seed for Azure rows ("AZUR"), disjoint from Mooncake
_WORDS_PER_DIGEST = 4  # xxh3_128 gives 16 bytes = 4 little-endian uint32 words


class TraceFormatError(ValueError):
    """A trace file or row that cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    `index`: 0-based position in the file (data rows only). `arrival_s`: seconds after the first
    loaded row (before `--speed`). `prompt_tokens` / `output_tokens`: lengths in tokens
    (`output_tokens` is sent as `max_tokens` with `ignore_eos`). `hash_ids`: the Mooncake block
    ids, or None for traces without prefix information. Token ids are built on demand by
    `PromptBuilder` (a whole Mooncake trace is ~145 M prompt tokens, too many to hold at once).
    """

    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None


def trace_format(path: str | Path) -> TraceFormat:
    """The format of a trace file from its extension: `.jsonl` Mooncake, `.csv` Azure.

    Raises TraceFormatError for any other extension.
    """
    suffix = Path(path).suffix.lower()
    if suffix == ".jsonl":
        return "mooncake"
    if suffix == ".csv":
        return "azure"
    raise TraceFormatError(
        f"{path}: unknown trace format {suffix or '(no extension)'!r}; "
        "expected .jsonl (Mooncake) or .csv (Azure)"
    )


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """Read the first `limit` requests (all when None) of a trace file, format from extension.

    Raises TraceFormatError (bad extension or row) and OSError (unreadable file).
    """
    fmt = trace_format(path)
    with open(path, encoding="utf-8", newline="") as f:
        if fmt == "mooncake":
            return parse_mooncake(f, limit=limit, source=str(path))
        return parse_azure(f, limit=limit, source=str(path))


def _int_field(row: dict[str, object], key: str, where: str, minimum: int) -> int:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(f"{where}: {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceFormatError(f"{where}: {key!r} must be >= {minimum}, got {value}")
    return value


def parse_mooncake(
    lines: Iterable[str], limit: int | None = None, source: str = "<mooncake>"
) -> list[TraceRequest]:
    """Parse Mooncake jsonl lines into requests (blank lines skipped), stopping after `limit`.

    `arrival_s = (timestamp - min timestamp of the loaded rows) / 1000`. Checks every row:
    integer `timestamp` >= 0, `input_length` >= 1, `output_length` >= 1, integer `hash_ids` with
    `len(hash_ids) == ceil(input_length / 512)`; raises TraceFormatError naming `source:line`.
    """
    _check_limit(limit)
    rows: list[tuple[int, int, int, tuple[int, ...]]] = []
    for lineno, line in enumerate(lines, start=1):
        if limit is not None and len(rows) >= limit:
            break
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{where}: not JSON ({e.msg})") from e
        if not isinstance(row, dict):
            raise TraceFormatError(f"{where}: expected a JSON object")
        ts = _int_field(row, "timestamp", where, 0)
        input_length = _int_field(row, "input_length", where, 1)
        output_length = _int_field(row, "output_length", where, 1)
        ids = row.get("hash_ids")
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**63 for i in ids
        ):
            raise TraceFormatError(f"{where}: 'hash_ids' must be a list of integers in [0, 2**63)")
        blocks = math.ceil(input_length / MOONCAKE_BLOCK_TOKENS)
        if len(ids) != blocks:
            raise TraceFormatError(
                f"{where}: {len(ids)} hash_ids for input_length {input_length}; expected "
                f"ceil({input_length} / {MOONCAKE_BLOCK_TOKENS}) = {blocks}"
            )
        rows.append((ts, input_length, output_length, tuple(ids)))
    origin = min((r[0] for r in rows), default=0)
    return [
        TraceRequest(
            index=i,
            arrival_s=(ts - origin) / 1000.0,
            prompt_tokens=input_length,
            output_tokens=output_length,
            hash_ids=ids,
        )
        for i, (ts, input_length, output_length, ids) in enumerate(rows)
    ]


def parse_azure(
    lines: Iterable[str], limit: int | None = None, source: str = "<azure>"
) -> list[TraceRequest]:
    """Parse Azure LLM inference csv lines (with header) into requests, stopping after `limit`.

    `arrival_s` = seconds since the earliest loaded `TIMESTAMP` (naive wall clock, parsed with
    `datetime.fromisoformat`). Requires columns TIMESTAMP, ContextTokens, GeneratedTokens with
    token counts >= 1; raises TraceFormatError naming `source:line`.
    """
    _check_limit(limit)
    reader = csv.DictReader(lines)
    needed = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    missing = [c for c in needed if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceFormatError(f"{source}: missing csv column(s) {', '.join(missing)}")
    rows: list[tuple[datetime, int, int]] = []
    for row in reader:
        if limit is not None and len(rows) >= limit:
            break
        where = f"{source}:{reader.line_num}"
        try:
            ts = datetime.fromisoformat(row["TIMESTAMP"].strip())
            context = int(row["ContextTokens"])
            generated = int(row["GeneratedTokens"])
        except (ValueError, AttributeError) as e:
            raise TraceFormatError(f"{where}: bad row {row!r} ({e})") from e
        if context < 1 or generated < 1:
            raise TraceFormatError(
                f"{where}: ContextTokens and GeneratedTokens must be >= 1, got "
                f"{context} and {generated}"
            )
        rows.append((ts, context, generated))
    origin = min((r[0] for r in rows), default=None)
    return [
        TraceRequest(
            index=i,
            arrival_s=(ts - origin).total_seconds() if origin is not None else 0.0,
            prompt_tokens=context,
            output_tokens=generated,
            hash_ids=None,
        )
        for i, (ts, context, generated) in enumerate(rows)
    ]


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")


class PromptBuilder:
    """Builds the token ids of a request's prompt: deterministic, shared blocks cached.

    Token ids lie in `[vocab_low, vocab_limit)`; `vocab_limit` must not exceed the served model's
    vocabulary size. Mooncake blocks are kept in an LRU of `cache_blocks` blocks (hash id 0 begins
    every conversation request, so hot blocks are reused); Azure blocks are never cached (no row
    shares them). Raises ValueError for an empty id range or a negative cache size.
    """

    def __init__(
        self,
        vocab_low: int = DEFAULT_VOCAB_LOW,
        vocab_limit: int = DEFAULT_VOCAB_LIMIT,
        cache_blocks: int = 4096,
    ) -> None:
        if not 0 <= vocab_low < vocab_limit:
            raise ValueError(
                f"need 0 <= vocab_low < vocab_limit, got vocab_low={vocab_low}, "
                f"vocab_limit={vocab_limit}"
            )
        if cache_blocks < 0:
            raise ValueError(f"cache_blocks must be >= 0, got {cache_blocks}")
        self.vocab_low = vocab_low
        self.vocab_limit = vocab_limit
        self._span = vocab_limit - vocab_low
        self._cache_blocks = cache_blocks
        self._cache: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    def prompt_ids(self, request: TraceRequest) -> list[int]:
        """The request's prompt as exactly `request.prompt_tokens` token ids.

        With `hash_ids`: the concatenation of each id's 512-token block, the last one cut.
        Without: blocks seeded by (`request.index`, block number) in the Azure namespace.
        """
        n = request.prompt_tokens
        ids: list[int] = []
        if request.hash_ids is not None:
            for hash_id in request.hash_ids:
                if len(ids) >= n:
                    break
                ids.extend(self.mooncake_block(hash_id))
        else:
            blocks = math.ceil(n / MOONCAKE_BLOCK_TOKENS)
            for b in range(blocks):
                ids.extend(self._block(_NS_AZURE, request.index, b))
        if len(ids) < n:  # only reachable for a hand-built TraceRequest with too few hash ids
            raise ValueError(
                f"request {request.index}: {len(request.hash_ids or ())} hash ids cannot cover "
                f"{n} prompt tokens"
            )
        del ids[n:]
        return ids

    def mooncake_block(self, hash_id: int) -> tuple[int, ...]:
        """The 512 token ids of Mooncake hash id `hash_id` (a function of the id alone)."""
        block = self._cache.get(hash_id)
        if block is not None:
            self._cache.move_to_end(hash_id)
            return block
        block = self._block(_NS_MOONCAKE, hash_id, 0)
        if self._cache_blocks:
            self._cache[hash_id] = block
            if len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        return block

    def _block(self, namespace: int, key: int, block_no: int) -> tuple[int, ...]:
        """512 ids from xxh3_128(key, block_no, counter; seed=namespace), 4 uint32 per digest.

        `id = vocab_low + word % span`; the modulo bias is < span / 2**32 (< 3e-5 for the
        default range), irrelevant for a synthetic workload.
        """
        digests = b"".join(
            xxhash.xxh3_128_digest(struct.pack("<qqI", key, block_no, counter), seed=namespace)
            for counter in range(MOONCAKE_BLOCK_TOKENS // _WORDS_PER_DIGEST)
        )
        low, span = self.vocab_low, self._span
        return tuple(low + w % span for w in struct.unpack(f"<{MOONCAKE_BLOCK_TOKENS}I", digests))
