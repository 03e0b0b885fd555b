"""Where rollouts are kept: the JSON file in the state directory (round trip, mode, the
errors of a bad or unwritable file, no temporary left behind) and the Redis hash on a
real redis-server (round trip, a bad value, an unreachable server)."""

from __future__ import annotations

import asyncio
import json
import resource
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from redis_server import RedisServer

from homing.rollout.plan import Rollout
from homing.rollout.store import FILE_NAME, FORMAT, FileStore, RedisStore, RolloutStoreError

T0 = 1_700_000_000.0


def _data(model: str, canary: str = "v2") -> dict[str, Any]:
    """What the controller stores for a model: its split and its rollout."""
    rollout = Rollout.start(model, "v1", canary, [5, 25, 100], 600.0, now=T0)
    return {"split": rollout.weights(), "rollout": rollout.to_dict(), "saved_at": T0}


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- FileStore --


async def test_file_store_round_trips_two_models(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    a, b = _data("a"), _data("b", canary="v3")
    await store.save("a", a, "")
    await store.save("b", b, "")
    assert await store.load() == {"a": a, "b": b}
    # A fresh store on the same directory (a restarted gateway) reads the same.
    assert await FileStore(str(tmp_path)).load() == {"a": a, "b": b}
    assert store.where == str(tmp_path / FILE_NAME)
    doc = json.loads((tmp_path / FILE_NAME).read_text())
    assert doc == {"format": FORMAT, "rollouts": {"a": a, "b": b}}


async def test_file_store_save_replaces_one_model_and_keeps_the_others(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    await store.save("a", _data("a"), "")
    await store.save("b", _data("b"), "")
    newer = _data("a", canary="v9")
    await store.save("a", newer, "")
    assert await store.load() == {"a": newer, "b": _data("b")}


async def test_file_store_concurrent_saves_of_two_models_keep_both(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    await asyncio.gather(*(store.save(f"m{i}", _data(f"m{i}"), "") for i in range(8)))
    assert sorted(await store.load()) == [f"m{i}" for i in range(8)]


async def test_file_store_writes_mode_0600_and_leaves_only_its_file(tmp_path: Path) -> None:
    state = tmp_path / "state"  # made by the first save
    store = FileStore(str(state))
    await store.save("a", _data("a"), "")
    assert stat.S_IMODE((state / FILE_NAME).stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    await store.save("b", _data("b"), "")
    assert stat.S_IMODE((state / FILE_NAME).stat().st_mode) == 0o600
    assert _listing(state) == [FILE_NAME]


async def test_file_store_missing_file_or_directory_loads_empty(tmp_path: Path) -> None:
    assert await FileStore(str(tmp_path)).load() == {}
    assert await FileStore(str(tmp_path / "not" / "made")).load() == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "cannot be read: "),
        (b"", "cannot be read: "),
        (b"\xff\xfe\x00", "cannot be read: "),
        (b"[]", f"not a homing rollouts file (format {FORMAT})"),
        (b'{"rollouts": {}}', f"not a homing rollouts file (format {FORMAT})"),
        (b'{"format": 2, "rollouts": {}}', f"not a homing rollouts file (format {FORMAT})"),
        (b'{"format": 1}', "'rollouts' is not a table of rollouts"),
        (b'{"format": 1, "rollouts": []}', "'rollouts' is not a table of rollouts"),
        (b'{"format": 1, "rollouts": {"m": 3}}', "'rollouts' is not a table of rollouts"),
    ],
)
async def test_file_store_bad_file_raises_naming_its_path_and_save_keeps_it(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    store = FileStore(str(tmp_path))
    with pytest.raises(RolloutStoreError) as err:
        await store.load()
    assert str(err.value).startswith(f"{path}: {message}")
    assert "\n" not in str(err.value)
    # A save does not paper over it: same error, the file untouched, no temporary left.
    with pytest.raises(RolloutStoreError) as err:
        await store.save("m", _data("m"), "")
    assert str(err.value).startswith(f"{path}: {message}")
    assert path.read_bytes() == content
    assert _listing(tmp_path) == [FILE_NAME]


async def test_file_store_state_dir_that_is_a_regular_file_raises_naming_the_path(
    tmp_path: Path,
) -> None:
    """Reading through a regular file is ENOTDIR, not "absent": load refuses (a restart
    must not forget a rollback it cannot see), and so does save, which reads first."""
    state = tmp_path / "state"
    state.write_text("not a directory")
    store = FileStore(str(state))
    expected = f"{state / FILE_NAME}: cannot be read: "
    with pytest.raises(RolloutStoreError) as err:
        await store.load()
    assert str(err.value).startswith(expected)
    with pytest.raises(RolloutStoreError) as err:
        await store.save("m", _data("m"), "")
    assert str(err.value).startswith(expected)
    assert state.read_text() == "not a directory"
    assert _listing(tmp_path) == ["state"]


async def test_file_store_directory_that_cannot_be_made_raises_cannot_be_written(
    tmp_path: Path,
) -> None:
    """The state dir is a dangling symlink: nothing stored (loads empty), and it cannot
    be made a directory (works as root too, unlike a chmod)."""
    state = tmp_path / "state"
    state.symlink_to(tmp_path / "gone" / "dir")
    store = FileStore(str(state))
    assert await store.load() == {}
    with pytest.raises(RolloutStoreError) as err:
        await store.save("m", _data("m"), "")
    assert str(err.value).startswith(f"{state / FILE_NAME}: cannot be written: ")
    assert _listing(tmp_path) == ["state"]


async def test_file_store_failed_write_leaves_no_temporary_and_the_old_file(
    tmp_path: Path,
) -> None:
    """The write itself fails (EFBIG under a small RLIMIT_FSIZE: a full disk's stand-in)
    after the temporary was made: it is removed and the old file stays whole."""
    store = FileStore(str(tmp_path))
    await store.save("a", _data("a"), "")
    before = (tmp_path / FILE_NAME).read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, hard))
    try:
        with pytest.raises(RolloutStoreError) as err:
            await store.save("b", _data("b"), "")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(err.value).startswith(f"{tmp_path / FILE_NAME}: cannot be written: ")
    assert "File too large" in str(err.value)
    assert _listing(tmp_path) == [FILE_NAME]
    assert (tmp_path / FILE_NAME).read_bytes() == before
    assert await store.load() == {"a": _data("a")}


async def test_file_store_unserializable_data_leaves_no_temporary(tmp_path: Path) -> None:
    """A value json cannot write fails mid-write as a store error, as the Redis store's
    does: the temporary goes, the file stays."""
    store = FileStore(str(tmp_path))
    await store.save("a", _data("a"), "")
    before = (tmp_path / FILE_NAME).read_bytes()
    with pytest.raises(RolloutStoreError, match="cannot be written: Object of type set"):
        await store.save("b", {"split": {"v1", "v2"}}, "")
    assert _listing(tmp_path) == [FILE_NAME]
    assert (tmp_path / FILE_NAME).read_bytes() == before


# -- RedisStore --


@pytest_asyncio.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_server.url)
    yield c
    await c.aclose()


def _prefix() -> str:
    """A prefix of this test's own (the server is shared by the session)."""
    return f"test-{uuid.uuid4().hex[:8]}"


async def test_redis_store_round_trips_two_models(client: aioredis.Redis) -> None:
    prefix = _prefix()
    store = RedisStore(client, prefix)
    assert store.where == f"redis key {prefix}:rollouts"
    assert await store.load() == {}
    a, b = _data("a"), _data("b", canary="v3")
    await store.save("a", a, "")
    await store.save("b", b, "")
    assert await store.load() == {"a": a, "b": b}
    newer = _data("a", canary="v9")
    await store.save("a", newer, "")
    assert await RedisStore(client, prefix).load() == {"a": newer, "b": b}
    assert json.loads(await client.hget(f"{prefix}:rollouts", "b")) == b


async def test_redis_store_a_bad_value_spoils_only_its_own_entry(client: aioredis.Redis) -> None:
    """A value that is not JSON, or not a table, is its model's `unreadable` entry; the
    other models' entries load as they are."""
    prefix = _prefix()
    store = RedisStore(client, prefix)
    await store.save("good", _data("good"), "")
    await client.hset(f"{prefix}:rollouts", "bad", "{not json")
    await client.hset(f"{prefix}:rollouts", "list", "[1, 2]")
    loaded = await store.load()
    assert loaded["good"] == _data("good")
    assert loaded["bad"]["unreadable"].startswith("not JSON: ")
    assert loaded["list"] == {"unreadable": "not a table"}


async def test_redis_store_a_field_that_is_not_utf8_raises_a_store_error(
    client: aioredis.Redis,
) -> None:
    """Not a bare UnicodeDecodeError: the gateway's start only turns RolloutStoreError
    into its one-line "rollouts: ..." refusal."""
    prefix = _prefix()
    await client.hset(f"{prefix}:rollouts", b"\xff\xfe", "{}")
    with pytest.raises(RolloutStoreError) as err:
        await RedisStore(client, prefix).load()
    assert str(err.value) == f"redis key {prefix}:rollouts: field b'\\xff\\xfe' is not UTF-8"


async def test_redis_store_a_stopped_server_raises_naming_the_key() -> None:
    server = RedisServer()
    server.start()
    c = aioredis.Redis.from_url(server.url)
    try:
        store = RedisStore(c, "gone", timeout_s=0.5)
        await store.save("m", _data("m"), "")
        server.stop()
        with pytest.raises(RolloutStoreError) as err:
            await store.load()
        assert str(err.value).startswith("redis key gone:rollouts: ")
        with pytest.raises(RolloutStoreError) as err:
            await store.save("m", _data("m"), "")
        assert str(err.value).startswith("redis key gone:rollouts: ")
    finally:
        server.stop()
        await c.aclose()


def test_redis_store_key_is_prefix_colon_rollouts() -> None:
    store = RedisStore(aioredis.Redis(), "homing")  # no connection until a call
    assert (store.key, store.where) == ("homing:rollouts", "redis key homing:rollouts")


# -- compare and set --


def _at(model: str, revision: str) -> dict[str, Any]:
    return {**_data(model), "revision": revision}


async def test_file_store_writes_only_over_the_revision_it_was_given(tmp_path: Path) -> None:
    """A save over a revision that is no longer the stored one writes nothing."""
    store = FileStore(str(tmp_path))
    assert await store.save("m", _at("m", "r1"), "")
    assert not await store.save("m", _at("m", "r2"), "")  # another writer's r1 is there
    assert (await store.load())["m"]["revision"] == "r1"
    assert await store.save("m", _at("m", "r2"), "r1")
    assert (await store.load())["m"]["revision"] == "r2"


async def test_redis_store_lets_one_of_two_racing_writers_win(redis_server: RedisServer) -> None:
    """Two instances saving over the same revision at once: exactly one write lands."""
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        store = RedisStore(client, f"cas-{uuid.uuid4().hex}")
        assert await store.save("m", _at("m", "r1"), "")
        first, second = {**_at("m", "a"), "by": "a"}, {**_at("m", "b"), "by": "b"}
        results = await asyncio.gather(store.save("m", first, "r1"), store.save("m", second, "r1"))
        assert sorted(results) == [False, True]
        stored = (await store.load())["m"]
        assert stored["by"] == stored["revision"] == ("a" if results[0] else "b")
        assert not await store.save("m", _at("m", "r3"), "r1")
    finally:
        await client.aclose()


def test_a_revision_is_a_string_unique_to_a_write() -> None:
    """A counter would repeat once a store is emptied; a non-string reads as none."""
    from homing.rollout.store import revision_of

    assert [revision_of({"revision": r}) for r in ("a1", 3, 3.0, None)] == ["a1", "", "", ""]
    assert revision_of(None) == ""


async def test_redis_store_reads_a_revision_that_is_not_a_string_as_none(
    client: aioredis.Redis,
) -> None:
    prefix = _prefix()
    await client.hset(f"{prefix}:rollouts", "m", json.dumps({**_data("m"), "revision": 3}))
    assert await RedisStore(client, prefix).save("m", _at("m", "r4"), "")
