"""Requests in flight per worker, seen by every gateway process of one box.

Rule of this file: a fixed table in a shared file mapping (`mmap`), with no lock on the
request path. Layout, native-endian int64 words:

    header  MAGIC, LAYOUT, processes P, slots S
    keys    S words: a worker URL's 63-bit hash (0: free slot)
    counts  P rows of S words: process p's requests in flight on the slot's worker

Each process stores only its own row's words (a plain store of its own count, so no update
is lost), and a reader sums the other rows: a word read while another process stores it is
the old or the new value (aligned 8-byte loads and stores do not tear on the machines
homing runs on). A slot is claimed under an exclusive `flock` of the file (a worker joining,
rare), probing linearly from its hash. A process that exits, killed or not, has its row
cleared by its supervisor before it starts again: its requests died with it.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
from dataclasses import dataclass

MAGIC = 0x484F4D494E470001  # "HOMING" and a version
LAYOUT = 1
HEADER_WORDS = 4
#: Slots by default: distinct worker URLs over the file's life (a slot is not reused).
DEFAULT_SLOTS = 4096


def url_key(url: str) -> int:
    """A worker URL's key in the table: the first 8 bytes of its BLAKE2b digest, 63 bits,
    never 0."""
    value = int.from_bytes(hashlib.blake2b(url.encode(), digest_size=8).digest(), "little")
    return (value >> 1) or 1


class InFlightBoard:
    """The table of one box's gateway processes over the file at `path` (see the module
    docstring). Make it with `create` (the leader) or `open` (the others)."""

    def __init__(self, path: str, fd: int, view: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self._map = view
        self._words = memoryview(view).cast("q")
        if self._words[0] != MAGIC or self._words[1] != LAYOUT:
            raise ValueError(f"{path} is not an in-flight board of this layout")
        self.processes = int(self._words[2])
        self.slots = int(self._words[3])
        self._counts = HEADER_WORDS + self.slots

    @classmethod
    def create(cls, path: str, processes: int, slots: int = DEFAULT_SLOTS) -> InFlightBoard:
        """A new, empty table for `processes` processes at `path` (mode 0600; an old file
        there is replaced). OSError when it cannot be made."""
        if processes < 1 or slots < 1:
            raise ValueError("need at least one process and one slot")
        size = 8 * (HEADER_WORDS + slots + processes * slots)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            view = mmap.mmap(fd, size)
            words = memoryview(view).cast("q")
            words[0], words[1], words[2], words[3] = MAGIC, LAYOUT, processes, slots
            words.release()
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, view)

    @classmethod
    def open(cls, path: str) -> InFlightBoard:
        """The table another process created at `path`. OSError when it cannot be
        opened, ValueError when it is no such table."""
        fd = os.open(path, os.O_RDWR)
        try:
            view = mmap.mmap(fd, os.fstat(fd).st_size)
            return cls(path, fd, view)
        except BaseException:
            os.close(fd)
            raise

    def slot(self, url: str) -> int | None:
        """The slot of worker `url`, claimed if it has none yet; None when the table is
        full (that worker's counts then stay each process's own)."""
        key = url_key(url)
        found = self._probe(key, claim=False)  # found without the lock in the usual case
        if found is not None:
            return found
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            return self._probe(key, claim=True)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _probe(self, key: int, *, claim: bool) -> int | None:
        """`key`'s slot, probing linearly from its hash; at the first free slot, None, or
        that slot taken for `key` when `claim` (call it holding the lock)."""
        words = self._words
        start = key % self.slots
        for i in range(self.slots):
            s = HEADER_WORDS + (start + i) % self.slots
            if words[s] == key:
                return s - HEADER_WORDS
            if words[s] == 0:
                if not claim:
                    return None
                words[s] = key
                return s - HEADER_WORDS
        return None

    def store(self, process: int, slot: int, count: int) -> None:
        """Process `process`'s requests in flight on `slot`'s worker are `count` now."""
        self._words[self._counts + process * self.slots + slot] = count

    def others(self, process: int, slot: int) -> int:
        """The requests every process but `process` has in flight on `slot`'s worker."""
        words, base, step = self._words, self._counts + slot, self.slots
        total = 0
        for p in range(self.processes):
            if p != process:
                total += words[base + p * step]
        return total

    def clear(self, process: int) -> None:
        """Zero process `process`'s row (it exited: its requests died with it)."""
        start = self._counts + process * self.slots
        self._words[start : start + self.slots] = memoryview(bytearray(8 * self.slots)).cast("q")

    def close(self) -> None:
        """Unmap and close the file (the table stays for the other processes)."""
        self._words.release()
        self._map.close()
        os.close(self._fd)


@dataclass
class SharedCount:
    """One worker's entry as one process sees it: `publish` its own count, read the
    others' (`others`)."""

    board: InFlightBoard
    process: int
    slot: int

    def publish(self, count: int) -> None:
        """This process has `count` requests in flight on the worker now."""
        self.board.store(self.process, self.slot, count)

    def others(self) -> int:
        """The requests the other processes have in flight on the worker."""
        return self.board.others(self.process, self.slot)


def box_total(own: int, shared: SharedCount | None) -> int:
    """`own` requests in flight plus the other processes' on the same entry (`own` alone
    without a board)."""
    return own if shared is None else own + shared.others()
