"""One process's quota store served to the other gateway processes of the same box.

Rule of this file: the transport of `QuotaStore` calls, nothing of their math. With
`gateway.processes` > 1 and the memory backend, the leader's `InProcessQuotaStore` is the
one store: `QuotaServer` answers its calls on a Unix socket of the leader's runtime
directory (mode 0600), and each follower's `RemoteQuotaStore` makes them, so a tenant's
limits hold across all processes as they do in one. One call is one HTTP/1.1 POST of a
JSON body over a kept-alive connection:

    /reserve  {"charge": C}                         -> {"denial": D | null}
    /settle   {"charge": C, "tokens": N, "refund": B} -> {"released": N}
    /renew    {"charges": [C, ...]}                  -> {}
    /usage    {"scope": S}                           -> {"requests": N, "tokens": N, "streams": N}
    /ping     {}                                     -> {}

C is a `Charge` and D a `Denial` as JSON objects of their fields (a charge's scopes a list
of `ScopeLimits` objects). A malformed body is 400 with {"error": text}.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from homing.gateway.quotas.types import (
    Charge,
    Denial,
    QuotaStore,
    QuotaStoreError,
    ScopeLimits,
    ScopeUsage,
)


def charge_json(charge: Charge) -> dict[str, Any]:
    """`charge` as a JSON object."""
    return dataclasses.asdict(charge)


def charge_of(body: Any) -> Charge:
    """The `Charge` a JSON object describes; ValueError (or TypeError/KeyError) when it
    does not."""
    scopes = tuple(ScopeLimits(**s) for s in body["scopes"])
    return Charge(charge_id=str(body["charge_id"]), tokens=int(body["tokens"]), scopes=scopes)


class QuotaServer:
    """Serves `store` on the Unix socket `path` (created 0600; a stale file is replaced)."""

    def __init__(self, store: QuotaStore, path: str) -> None:
        self.store = store
        self.path = path
        app = web.Application()
        for name, handler in (
            ("reserve", self._reserve),
            ("settle", self._settle),
            ("renew", self._renew),
            ("usage", self._usage),
            ("ping", self._ping),
        ):
            app.router.add_post(f"/{name}", handler)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> None:
        """Listen; OSError when the socket cannot be made."""
        await self._runner.setup()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a stale socket of an earlier run
        site = web.UnixSite(self._runner, self.path)
        old = os.umask(0o177)
        try:
            await site.start()
        finally:
            os.umask(old)

    async def stop(self) -> None:
        """Stop listening and remove the socket file."""
        await self._runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _call(self, request: web.Request, work: Any) -> web.Response:
        try:
            body = await request.json()
        except ValueError as err:
            return web.json_response({"error": f"not JSON: {err}"}, status=400)
        try:
            result = await work(body)
        except (KeyError, TypeError, ValueError) as err:
            return web.json_response({"error": f"malformed call: {err!r}"}, status=400)
        return web.json_response(result)

    async def _reserve(self, request: web.Request) -> web.Response:
        async def work(body: Any) -> Any:
            denial = await self.store.reserve(charge_of(body["charge"]))
            return {"denial": dataclasses.asdict(denial) if denial is not None else None}

        return await self._call(request, work)

    async def _settle(self, request: web.Request) -> web.Response:
        async def work(body: Any) -> Any:
            charge = charge_of(body["charge"])
            released = await self.store.settle(
                charge, int(body["tokens"]), refund=bool(body.get("refund", False))
            )
            return {"released": released}

        return await self._call(request, work)

    async def _renew(self, request: web.Request) -> web.Response:
        async def work(body: Any) -> Any:
            await self.store.renew([charge_of(c) for c in body["charges"]])
            return {}

        return await self._call(request, work)

    async def _usage(self, request: web.Request) -> web.Response:
        async def work(body: Any) -> Any:
            return dataclasses.asdict(await self.store.usage(str(body["scope"])))

        return await self._call(request, work)

    async def _ping(self, request: web.Request) -> web.Response:
        async def work(body: Any) -> Any:
            await self.store.ping()
            return {}

        return await self._call(request, work)


class RemoteQuotaStore:
    """A `QuotaStore` whose calls `QuotaServer` at the Unix socket `path` answers; each at
    most `timeout_s` seconds. Every method raises `QuotaStoreError` when the server cannot
    be reached, answers late, or answers other than 200 (its error in the message)."""

    def __init__(self, path: str, *, timeout_s: float) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.path),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        return self._session

    async def _post(self, name: str, body: dict[str, Any]) -> Any:
        try:
            async with self._client().post(f"http://quotas/{name}", json=body) as resp:
                answer = await resp.json()
                if resp.status != 200:
                    raise QuotaStoreError(f"quota server: {resp.status} {answer}")
                return answer
        except (TimeoutError, aiohttp.ClientError, ValueError) as err:
            raise QuotaStoreError(f"quota server at {self.path}: {err!r}") from None

    async def reserve(self, charge: Charge) -> Denial | None:
        """See `QuotaStore.reserve`."""
        answer = await self._post("reserve", {"charge": charge_json(charge)})
        denial = answer["denial"]
        return Denial(**denial) if denial is not None else None

    async def settle(self, charge: Charge, tokens: int, *, refund: bool = False) -> int:
        """See `QuotaStore.settle`."""
        body = {"charge": charge_json(charge), "tokens": tokens, "refund": refund}
        return int((await self._post("settle", body))["released"])

    async def renew(self, charges: Sequence[Charge]) -> None:
        """See `QuotaStore.renew`."""
        await self._post("renew", {"charges": [charge_json(c) for c in charges]})

    async def usage(self, scope: str) -> ScopeUsage:
        """See `QuotaStore.usage`."""
        return ScopeUsage(**(await self._post("usage", {"scope": scope})))

    async def ping(self) -> None:
        """See `QuotaStore.ping`."""
        await self._post("ping", {})

    async def close(self) -> None:
        """Close the connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None
