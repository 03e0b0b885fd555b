"""`/metrics` of a gateway run as several processes: every process's series in one answer.

The processes share the HTTP port, so a scrape reaches any one of them. Each serves its own
registry's exposition on a Unix socket of the leader's runtime directory
(`process-N.metrics`, mode 0600), and the `/metrics` of whichever process was reached is
the union of all of them, each sample labelled `process="N"` (sum them away with
`sum without (process) (...)`). A process that does not answer within `PEER_TIMEOUT_S` is
left out of that scrape, and `homing_gateway_processes_scraped` says how many were in it.

Rule of this file: `merge` is pure (text in, text out, through prometheus_client's parser
and writer); `ProcessMetrics` does the socket work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = structlog.get_logger("homing.obs")

#: How long a scrape waits for another process's exposition (s).
PEER_TIMEOUT_S = 1.0
PROCESS_LABEL = "process"


class _Families:
    """What `generate_latest` reads: the families to write."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(parts: Sequence[tuple[int, bytes]]) -> bytes:
    """One exposition of `parts`, (process index, its exposition text): every family once,
    with each process's samples labelled `process="N"`, plus the gauge
    `homing_gateway_processes_scraped` (how many parts there were). ValueError for a part
    that is not the text format."""
    families: dict[str, Metric] = {}
    for index, text in parts:
        for family in text_string_to_metric_families(text.decode()):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for s in family.samples:
                labels = {**s.labels, PROCESS_LABEL: str(index)}
                merged.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
    scraped = GaugeMetricFamily(
        "homing_gateway_processes_scraped",
        "Gateway processes whose series are in this scrape",
        value=len(parts),
    )
    return generate_latest(_Families([*families.values(), scraped]))  # type: ignore[arg-type]


def _readable(part: tuple[int, bytes]) -> bool:
    """Whether `part`'s exposition parses (an unreadable one is left out of a scrape)."""
    try:
        merge([part])
    except ValueError:
        return False
    return True


class ProcessMetrics:
    """Process `index` of `processes` whose sockets live in `runtime`: `start` serves
    `own()`'s exposition on its socket; `exposition(mine)` is the merged answer."""

    def __init__(self, runtime: Path, index: int, processes: int, own: object) -> None:
        self.index = index
        self._own = own
        self._path = runtime / f"process-{index}.metrics"
        self._peers = {j: runtime / f"process-{j}.metrics" for j in range(processes) if j != index}
        self._runner: web.AppRunner | None = None
        self._inode: int | None = None

    async def start(self) -> None:
        """Serve this process's exposition on its socket. OSError when it cannot."""
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)  # a stale socket of an earlier run of this index
        old = os.umask(0o177)
        try:
            await web.UnixSite(self._runner, str(self._path)).start()
        finally:
            os.umask(old)
        self._inode = os.stat(self._path).st_ino

    async def stop(self) -> None:
        """Stop serving and remove the socket."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self._path).st_ino == self._inode:  # not a newer process's socket
                os.unlink(self._path)

    async def _serve(self, request: web.Request) -> web.Response:
        return web.Response(body=self._own())  # type: ignore[operator]

    async def _fetch(self, index: int, path: Path) -> tuple[int, bytes] | None:
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(path)),
                timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S),
            ) as session:
                async with session.get("http://process/metrics") as resp:
                    if resp.status == 200:
                        return index, await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            log.warning("process_metrics_unavailable", process=index, error=repr(err))
        return None

    async def exposition(self, mine: bytes) -> bytes:
        """This process's exposition `mine` merged with every other process's that
        answers."""
        fetched = await asyncio.gather(*(self._fetch(j, p) for j, p in self._peers.items()))
        parts = sorted([(self.index, mine), *(f for f in fetched if f is not None)])
        try:  # parsing every exposition costs ms per process: off the serving loop
            return await asyncio.to_thread(merge, parts)
        except ValueError as err:  # a peer's answer that is not the text format
            log.warning("process_metrics_unreadable", error=str(err))
            return await asyncio.to_thread(lambda: merge([p for p in parts if _readable(p)]))
