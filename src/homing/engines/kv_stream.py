"""Sans-I/O reader of one SubscribeKvEvents stream: batches in, what to do out.

Rule of this file: sequence bookkeeping lives here and nowhere else. Per `dp_rank`, batches
carry consecutive `sequence_number`s. For each batch `KvStreamCursor.feed` says whether to
read its load record, flush the worker's index first (a gap: batches were lost, so what the
index holds for the worker may be stale) and apply its events:

- `load_only` batches (heartbeats, and the records numbered 0 sent before the first batch
  when `load_records_before_first_batch` is set) carry a load and no events: load only.
- the first event batch of a subscription (per rank) sets the cursor; applied.
- `sequence == last + 1`: applied. `sequence == last`: a duplicate, skipped.
- `sequence > last + 1`: a gap of `sequence - last - 1` batches: flush, then apply.
- `sequence < last`: the numbering went backwards, which a live worker never does: it
  restarted behind a connection that survived (a proxy): `reset` (flush), then apply.

The caller flushes the worker when it (re)subscribes, since a new subscription starts
from the worker's current state, not from what it sent before.
"""

from __future__ import annotations

from dataclasses import dataclass

from smg_grpc_proto.generated import common_pb2


@dataclass(frozen=True)
class KvStep:
    """What to do with one batch: read `load` (None: none), `flush` first, `apply` events.

    `gap`: batches lost before this one (0 unless `flush`). `rank`: the batch's dp_rank
    (None when the servicer does not set it). `reset`: the sequence went backwards (a
    restart); `flush` is also set.
    """

    load: common_pb2.EngineLoad | None
    flush: bool
    apply: bool
    gap: int = 0
    rank: int | None = None
    reset: bool = False


class KvStreamCursor:
    """Last sequence number seen per dp_rank on one subscription (see module docstring)."""

    def __init__(self) -> None:
        self._last: dict[int | None, int] = {}

    def feed(self, batch: common_pb2.KvEventBatch) -> KvStep:
        """Classify `batch` and advance the cursor. Only its header is read
        (`sequence_number`, `dp_rank`, `load`), so the header the router decoded from the
        wire bytes (`DecodedKvBatch.header`, without the events) serves as well."""
        rank = batch.dp_rank if batch.HasField("dp_rank") else None
        load = batch.load if batch.HasField("load") else None
        if load is not None and load.load_only:
            return KvStep(load=load, flush=False, apply=False, rank=rank)
        seq = batch.sequence_number
        last = self._last.get(rank)
        if last is None:
            self._last[rank] = seq
            return KvStep(load=load, flush=False, apply=True, rank=rank)
        if seq == last:
            return KvStep(load=load, flush=False, apply=False, rank=rank)
        if seq < last:
            self._last = {rank: seq}
            return KvStep(load=load, flush=True, apply=True, rank=rank, reset=True)
        self._last[rank] = seq
        gap = seq - last - 1
        return KvStep(load=load, flush=gap > 0, apply=True, gap=gap, rank=rank)

    def last_sequence(self, rank: int | None = None) -> int | None:
        """The last sequence number accepted on `rank` (None: nothing yet)."""
        return self._last.get(rank)
