"""The router's own dispatch ledger: prefill work it sent that load records cannot show yet.

Rule of this file: pure bookkeeping on an injected time axis. An engine's EngineLoad record
lags (it is taken at a scheduler step and travels with the next KV-event batch), so between
records the router adds what it dispatched itself: `record(worker, at, tokens)` on every
decision, `pending(worker, since)` = tokens recorded at or after `since` (the record's
time). Entries older than `horizon_s` are dropped (a record newer than that always exists
while a worker is alive: SGLang-style heartbeats come every second or so when busy).
"""

from __future__ import annotations

from collections import deque

#: Entries are kept this long (s); a worker without a load record for longer is judged on
#: its last record alone.
DEFAULT_HORIZON_S = 10.0


class DispatchLedger:
    """Per-worker (time, uncached tokens) of the router's own recent dispatches.

    `oldest`: time (s) of the oldest kept entry per worker with kept entries, and `sums` its
    kept tokens: the hot loop reads `sums[w]` directly when `oldest[w] >= since` (nothing
    to drop) and calls `pending` otherwise. Queries with a later `since` drop the entries
    before it for good (a newer record has absorbed them), so each entry is visited O(1)
    times.
    """

    def __init__(self, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        if not horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {horizon_s}")
        self.horizon_s = horizon_s
        self._entries: dict[str, deque[tuple[float, int]]] = {}
        self.sums: dict[str, int] = {}
        self.oldest: dict[str, float] = {}

    def record(self, worker_id: str, at: float, tokens: int) -> None:
        """Note `tokens` uncached prompt tokens sent to `worker_id` at time `at` (s)."""
        entries = self._entries.get(worker_id)
        if entries is None:
            entries = self._entries[worker_id] = deque()
            self.sums[worker_id] = 0
        if not entries:
            self.oldest[worker_id] = at
        entries.append((at, tokens))
        self.sums[worker_id] += tokens
        self._drop_before(worker_id, entries, at - self.horizon_s)

    def pending(self, worker_id: str, since: float | None) -> int:
        """Tokens sent to `worker_id` at or after `since` (all kept entries when None)."""
        entries = self._entries.get(worker_id)
        if not entries:
            return 0
        if since is not None and entries[0][0] < since:
            self._drop_before(worker_id, entries, since)
        return self.sums[worker_id]

    def _drop_before(self, worker_id: str, entries: deque[tuple[float, int]], t: float) -> None:
        total = self.sums[worker_id]
        while entries and entries[0][0] < t:
            total -= entries.popleft()[1]
        self.sums[worker_id] = total
        if entries:
            self.oldest[worker_id] = entries[0][0]
        else:
            self.oldest.pop(worker_id, None)

    def forget(self, worker_id: str) -> None:
        """Drop `worker_id`'s entries (it left the pool)."""
        self._entries.pop(worker_id, None)
        self.sums.pop(worker_id, None)
        self.oldest.pop(worker_id, None)
