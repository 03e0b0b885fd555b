"""The common events of a serialized `KvEventBatch`, read in C (`_native/kvwire.c`).

Built by `make` (`pip install -e .`); optional: `homing.router.events.ingest_batch` and
`decode_batch` fall back to reading the message in Python where it is missing.
"""

def parse_events(
    raw: bytes | bytearray | memoryview, /
) -> list[list[tuple[int, int | None, bytes, int]] | tuple[list[int], int | None, bool] | int]:
    """The events of the serialized `KvEventBatch` `raw`, in stream order, as items:

    - a `list` of `(engine_hash, parent_engine_hash or None, token bytes, tier)`: a run of
      consecutive stored events of the fast shape (blocks without lora_id or extra keys;
      no lora_name, cache_salt, kv_cache_spec_kind, non-zero sliding window or REMOTE
      locality), one tuple per block: an event's first block has its
      `parent_block_hash`, each later block the hash of the one before it. Token bytes are
      the token ids as uint32 little-endian; tier is the `tier` field when set and not
      UNSPECIFIED, else the first block's `cache_level + 1` when set, else DEVICE.
    - a `tuple` `(engine_hashes, tier or None, shared)` for a removed event: tier as for
      stored events but None when neither is set; `shared` when locality is REMOTE.
    - an `int`: the index in `batch.events` of any other event (cleared, other stored
      shapes, no data, or a field not read as the schema says: a repeated singular, an
      unexpected wire type, an out-of-range value). Python reads it from the message.

    Unknown fields are skipped. Raises ValueError ("malformed KvEventBatch: ... at byte
    N") when `raw` is not a well-formed protobuf message (a truncated varint, a length
    past the end, an invalid wire type or tag, groups nested past upb's depth limit) or a
    string field of an event read here is not UTF-8; never where upb parses `raw`. The rest of
    an event returned as an index is not read, so bytes malformed only there pass.
    TypeError: `raw` does not support the buffer protocol.
    """

def parse_batch(
    raw: bytes | bytearray | memoryview, /
) -> tuple[
    bytes,
    int,
    list[list[tuple[int, int | None, bytes, int]] | tuple[list[int], int | None, bool] | bytes],
]:
    """`(header, event_count, items)` of the serialized `KvEventBatch` `raw`, read once:

    - `header`: the bytes of every field of the batch but its events (sequence_number,
      timestamp, dp_rank, snapshot, load, unknown fields), in order, as they were on the
      wire: what upb parses into the same header it would parse from `raw`.
    - `event_count`: the events in `raw`.
    - `items`: as `parse_events` gives them, except that an event left to Python is the
      bytes of its whole field (tag and length included): a batch of that one event, which
      upb parses at the nesting depth the event has in `raw`.

    Raises ValueError as `parse_events` does, and also for invalid UTF-8 in the string
    fields of the events read here; together with upb's parse of `header` and of the
    events returned as bytes, that rejects exactly the bytes upb rejects.
    TypeError: `raw` does not support the buffer protocol.
    """
