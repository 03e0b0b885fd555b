"""`homing top`'s scaler feed keeps Ctrl-C out of its event loop: a SIGINT that arrives while
a `GetScaler` call runs is raised once the call has returned, and the feed still closes."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from homing.top.scaler import ScalerFeed, ScalerView


class _InterruptedFeed(ScalerFeed):
    """A feed whose call is interrupted by a SIGINT to this process midway through."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", None, explicit=False)
        self.finished = False

    async def _fetch(self) -> ScalerView:
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.01)  # the loop runs on past the signal
        self.finished = True
        return ScalerView()


def test_a_sigint_during_a_scaler_call_is_raised_after_it_and_the_feed_closes() -> None:
    feed = _InterruptedFeed()
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            feed.fetch()
        assert feed.finished  # the call ran to its end: nothing was cut inside the loop
        assert signal.getsignal(signal.SIGINT) is handler  # Ctrl-C is the caller's again
    finally:
        feed.close()
    assert feed._loop.is_closed()


def test_a_scaler_call_without_sigint_returns_its_view() -> None:
    feed = ScalerFeed("127.0.0.1:1", None, explicit=False)
    try:
        view = feed.fetch()  # nothing listens on port 1: silent, as an address nobody chose
    finally:
        feed.close()
    assert view == ScalerView()
