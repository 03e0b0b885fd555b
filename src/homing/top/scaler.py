"""`homing top`'s scaler lines: each autoscaled pool's state, read from the admin API's
`GetScaler` (`homing.admin.client`), one call per refresh on one event loop kept for the
command's life.

Address and key as the admin verbs take them: `--admin ADDR`, else `$HOMING_ADMIN`, else the
default socket; `--admin-key KEY`, else `$HOMING_ADMIN_KEY`. The admin API is a second,
independent source: point `--admin` at the same gateway as `--url`. A failed call gives no
pools and its error, except that no admin socket at an address nobody chose (the default,
with neither `--admin` nor `$HOMING_ADMIN`) and a server without `GetScaler` are silent:
top then shows the metrics alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from homing.admin.client import AdminClient

#: Seconds one `GetScaler` call may take before the refresh goes on without it.
SCALER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ScalerView:
    """One refresh's scaler data: `pools`, the autoscaled pools as
    `homing.admin.commands.scaler_dict` gives them ([] when none or on failure); `error`,
    why the call failed (None: it answered, or failed silently)."""

    pools: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


class ScalerFeed:
    """`GetScaler` once per `fetch()`, on an event loop of its own; `close()` at the end.

    `address`/`key`: as `AdminClient` takes them (None: from the environment, else the
    default socket). `explicit`: the address was chosen (`--admin` or `$HOMING_ADMIN`), so
    an unreachable one is reported rather than silent. Raises ValueError for an address of
    neither form `unix:PATH` nor `HOST:PORT`.
    """

    def __init__(self, address: str | None, key: str | None, *, explicit: bool) -> None:
        from homing.admin.client import resolve_address

        self.address = resolve_address(address)
        self.key = key
        self.explicit = explicit
        self._loop = asyncio.new_event_loop()
        self._client: AdminClient | None = None

    @classmethod
    def from_args(cls, admin: str | None, key: str | None) -> ScalerFeed:
        """The feed of top's `--admin` and `--admin-key` (None: not given)."""
        return cls(admin, key, explicit=admin is not None or bool(os.environ.get("HOMING_ADMIN")))

    def fetch(self) -> ScalerView:
        """The autoscaled pools now, or why they are not known. A Ctrl-C during the call
        is raised as KeyboardInterrupt once it returns (at most `SCALER_TIMEOUT_S` later;
        see `_sigint_held`)."""
        with _sigint_held() as caught:
            view = self._loop.run_until_complete(self._fetch())
        if caught:
            raise KeyboardInterrupt
        return view

    async def _fetch(self) -> ScalerView:
        import grpc

        from homing.admin.client import AdminClient, AdminError
        from homing.admin.commands import scaler_dict

        if self._client is None:  # made on this loop, which its channel then keeps
            self._client = AdminClient(self.address, key=self.key, timeout_s=SCALER_TIMEOUT_S)
        try:
            response = await self._client.get_scaler()
        except AdminError as err:
            silent = err.code is grpc.StatusCode.UNIMPLEMENTED or (
                err.code is grpc.StatusCode.UNAVAILABLE and not self.explicit
            )
            return ScalerView(error=None if silent else err.message)
        return ScalerView(pools=scaler_dict(response)["pools"])

    def close(self) -> None:
        """Close the channel and the loop; safe to call more than once."""
        if self._loop.is_closed():
            return
        client, self._client = self._client, None
        try:
            if client is not None:
                with _sigint_held():  # closing on the way out: a Ctrl-C here changes nothing
                    self._loop.run_until_complete(client.close())
        finally:
            self._loop.close()


@contextlib.contextmanager
def _sigint_held() -> Iterator[list[int]]:
    """Hold SIGINT while the block runs the feed's event loop, and give the signals that
    came: a KeyboardInterrupt raised inside the loop's gRPC call could leave its channel
    unable to close. Only where Ctrl-C would raise KeyboardInterrupt (Python's default
    handler, in the main thread); elsewhere (an ignored SIGINT, a handler of the caller's,
    another thread) nothing changes and the list stays empty."""
    caught: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield caught
        return
    signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
