"""`homing top`'s scaler feed keeps Ctrl-C out of its event loop: a SIGINT that arrives while
a `GetScaler` call runs is raised once the call has returned, and the feed still closes;
where Ctrl-C is not Python's KeyboardInterrupt (ignored, or the caller's own handler) the
feed leaves it alone."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from homing.top.scaler import ScalerFeed, ScalerView


class _InterruptedFeed(ScalerFeed):
    """A feed whose call is interrupted by a SIGINT to this process midway through."""

    def __init__(self, address: str) -> None:
        super().__init__(address, None, explicit=False)
        self.finished = False

    async def _fetch(self) -> ScalerView:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.01)  # the loop runs on past the signal
        self.finished = True
        return ScalerView()


@pytest.fixture
def nowhere(tmp_path: Path) -> str:
    """An admin address nothing listens on (refused at once)."""
    return f"unix:{tmp_path / 'none.sock'}"


@pytest.fixture
def sigint_restored() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


def test_a_sigint_during_a_scaler_call_is_raised_after_it_and_the_feed_closes(
    nowhere: str,
) -> None:
    feed = _InterruptedFeed(nowhere)
    try:
        with pytest.raises(KeyboardInterrupt):
            feed.fetch()
        assert feed.finished  # the call ran to its end: nothing was cut inside the loop
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        feed.close()
    assert feed._loop.is_closed()


def test_an_ignored_sigint_stays_ignored_during_a_scaler_call(
    nowhere: str, sigint_restored: None
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    feed = _InterruptedFeed(nowhere)
    try:
        assert feed.fetch() == ScalerView()  # no KeyboardInterrupt: the signal is ignored
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        feed.close()


def test_a_scaler_call_without_sigint_returns_its_view(nowhere: str) -> None:
    feed = ScalerFeed(nowhere, None, explicit=False)
    try:
        view = feed.fetch()  # no admin socket at an address nobody chose: silent
        feed.fetch()  # the second call reuses the client made on the feed's loop
    finally:
        feed.close()
    assert view == ScalerView()
