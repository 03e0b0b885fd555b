"""Pool bookkeeping without a network: in-flight released once, only transport errors count."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from homing.engines.client import EngineError
from homing.engines.pool import PoolConfig, WorkerPool
from homing.router import Router


def make_pool() -> WorkerPool:
    """A pool over two addresses that are never contacted (start() is not called)."""
    return WorkerPool(
        ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"], router=Router(), config=PoolConfig()
    )


def test_worker_ids_follow_url_order() -> None:
    """Workers are w0, w1, ... in the order of their urls."""
    pool = make_pool()
    assert [(w.worker_id, w.url) for w in pool.workers()] == [
        ("w0", "grpc://127.0.0.1:1"),
        ("w1", "grpc://127.0.0.1:2"),
    ]


def test_duplicate_urls_rejected() -> None:
    """The same url twice is a configuration error."""
    with pytest.raises(ValueError):
        WorkerPool(["grpc://a:1", "grpc://a:1"], router=Router())


def test_track_releases_on_exception() -> None:
    """An exception inside track() still releases the slot, exactly once."""
    pool = make_pool()
    with pytest.raises(RuntimeError), pool.track("w0"):
        assert pool.state("w0").in_flight == 1
        raise RuntimeError("boom")
    assert pool.total_in_flight == 0


async def test_track_releases_on_cancellation() -> None:
    """A task cancelled while holding a slot releases it."""
    pool = make_pool()
    entered = asyncio.Event()

    async def hold() -> None:
        with pool.track("w1"):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(hold())
    await entered.wait()
    assert pool.total_in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.total_in_flight == 0


def test_unknown_worker_is_a_key_error() -> None:
    """Tracking an unknown worker fails loudly instead of counting nowhere."""
    with pytest.raises(KeyError), make_pool().track("w9"):
        pass


def test_only_transport_errors_count_toward_health() -> None:
    """INVALID_ARGUMENT never moves the failure count; UNAVAILABLE does."""
    pool = make_pool()
    pool.report_failure("w0", EngineError(grpc.StatusCode.INVALID_ARGUMENT, "bad"))
    assert pool.state("w0").consecutive_failures == 0
    pool.report_failure("w0", EngineError(grpc.StatusCode.UNAVAILABLE, "down"))
    assert pool.state("w0").consecutive_failures == 1


def test_model_info_before_discovery_raises() -> None:
    """Discovery-derived properties are unavailable until a worker answered."""
    with pytest.raises(RuntimeError):
        _ = make_pool().served_model_name
