"""Where rollouts are kept between gateway restarts: a JSON file in the state directory, or a
Redis hash when quotas use Redis (then every instance sharing that Redis sees them).

Rule of this file: I/O only; what is stored is one JSON object per model, read back as the
same dicts (the caller parses them and decides what a bad one means). Each object carries a
`revision`, a string unique to each write (a counter would repeat once a store is emptied);
`save` writes only over the revision the caller last saw (compare and set, atomic in Redis
through a Lua script), so two gateway instances cannot both move one rollout. Errors:
`RolloutStoreError` with one line naming the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from typing import Any, Protocol

#: Name of the file in the state directory.
FILE_NAME = "rollouts.json"

#: Format marker of the file and of each Redis value.
FORMAT = 1


class RolloutStoreError(Exception):
    """The store could not be read or written (one line, naming it)."""


def revision_of(data: dict[str, Any] | None) -> str:
    """The `revision` of stored data ("" for none, or one that is not a string)."""
    value = (data or {}).get("revision")
    return value if isinstance(value, str) else ""


class RolloutStore(Protocol):
    """Keeps each model's rollout data."""

    @property
    def where(self) -> str:
        """The store in words (a path, a Redis key)."""
        ...

    @property
    def shared(self) -> bool:
        """Other gateway instances may write it (their changes are to be followed)."""
        ...

    async def load(self) -> dict[str, dict[str, Any]]:
        """Model -> its stored rollout data (empty when none); an entry of its own that
        cannot be read is `{"unreadable": why}`, so one model's bad entry spoils no other's."""
        ...

    async def save(self, model: str, data: dict[str, Any], expected: str) -> bool:
        """Store `model`'s rollout data if its stored revision is `expected` ("": none
        stored); False, nothing written, when another writer got there first."""
        ...


class FileStore:
    """One JSON file, `{"format": 1, "rollouts": {model: data}}`, written whole to a
    temporary file, synced and renamed into place (a crash leaves the old or the new file,
    never half of one). Mode 0600."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, FILE_NAME)
        self._lock = asyncio.Lock()

    @property
    def where(self) -> str:
        return self.path

    @property
    def shared(self) -> bool:
        return False

    async def load(self) -> dict[str, dict[str, Any]]:
        return await asyncio.to_thread(self._read)

    async def save(self, model: str, data: dict[str, Any], expected: str) -> bool:
        async with self._lock:
            return await asyncio.to_thread(self._update, model, data, expected)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise RolloutStoreError(f"{self.path}: cannot be read: {err}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise RolloutStoreError(f"{self.path}: not a homing rollouts file (format {FORMAT})")
        rollouts = doc.get("rollouts")
        if not isinstance(rollouts, dict) or not all(
            isinstance(v, dict) for v in rollouts.values()
        ):
            raise RolloutStoreError(f"{self.path}: 'rollouts' is not a table of rollouts")
        return rollouts

    def _update(self, model: str, data: dict[str, Any], expected: str) -> bool:
        rollouts = self._read()
        if revision_of(rollouts.get(model)) != expected:
            return False
        rollouts[model] = data
        directory = os.path.dirname(self.path) or "."
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".rollouts-", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"format": FORMAT, "rollouts": rollouts}, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename itself survives a crash
            finally:
                os.close(dir_fd)
        except (OSError, TypeError, ValueError) as err:
            raise RolloutStoreError(f"{self.path}: cannot be written: {err}") from None
        return True


#: Compare and set of one hash field: KEYS[1] the hash, ARGV[1] the field, ARGV[2] the
#: revision expected there ("": none), ARGV[3] the new JSON. 1 when written, 0 when not.
_CAS_SCRIPT = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local revision = ''
if current then
  local ok, data = pcall(cjson.decode, current)
  local r = ok and type(data) == 'table' and data['revision']
  if type(r) == 'string' then revision = r end
end
if revision ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


class RedisStore:
    """A Redis hash `<prefix>:rollouts`: field = model, value = the rollout's JSON.
    `client`: a `redis.asyncio.Redis`; `timeout_s` bounds each call."""

    def __init__(self, client: Any, prefix: str, timeout_s: float = 2.0) -> None:
        self._client = client
        self.key = f"{prefix}:rollouts"
        self._timeout_s = timeout_s
        self._cas = client.register_script(_CAS_SCRIPT)

    @property
    def where(self) -> str:
        return f"redis key {self.key}"

    @property
    def shared(self) -> bool:
        return True

    async def load(self) -> dict[str, dict[str, Any]]:
        try:
            async with asyncio.timeout(self._timeout_s):
                raw = await self._client.hgetall(self.key)
        except Exception as err:  # redis errors, timeouts: the store is unreachable
            raise RolloutStoreError(f"{self.where}: {type(err).__name__}: {err}") from None
        out: dict[str, dict[str, Any]] = {}
        for field, value in raw.items():
            try:
                model = field.decode() if isinstance(field, bytes) else str(field)
            except UnicodeDecodeError:
                raise RolloutStoreError(f"{self.where}: field {field!r} is not UTF-8") from None
            try:
                data = json.loads(value)
            except ValueError as err:
                data = {"unreadable": f"not JSON: {err}"}
            if not isinstance(data, dict):
                data = {"unreadable": "not a table"}
            out[model] = data
        return out

    async def save(self, model: str, data: dict[str, Any], expected: str) -> bool:
        try:
            text = json.dumps(data)
            async with asyncio.timeout(self._timeout_s):
                written = await self._cas(keys=[self.key], args=[model, expected, text])
        except Exception as err:
            raise RolloutStoreError(f"{self.where}: {type(err).__name__}: {err}") from None
        return bool(written)
