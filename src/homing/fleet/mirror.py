"""A follower process's fleet kept in step with the leader's (`homing serve --processes N`).

The leader owns membership: the admin API, the scaler and the operator add, cordon and drain
workers there. Each follower polls the leader's worker list (`ListWorkers` on its admin
socket) and moves its own `Fleet` to match, one round per `interval_s`:

- `mirror_actions`: the pure decision, leader list + own workers -> actions;
- `FleetMirror`: the loop that reads, decides and applies them to a `Fleet`;
- `leader_reader`: the read, over the leader's admin socket.

Workers are matched by canonical URL (`check_worker_url`): worker ids differ between
processes. Health and outlier ejection stay each process's own: a worker the leader ejected
is still added here, and a worker ejected here is not readmitted because the leader serves
it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import grpc
import structlog

from homing.clock import Clock
from homing.config.rules import check_worker_url
from homing.engines.lifecycle import Phase
from homing.fleet.fleet import Fleet, FleetError
from homing.v1 import admin_pb2 as pb
from homing.v1 import admin_pb2_grpc as pb_grpc

log = structlog.get_logger("homing.fleet")

#: Seconds one read of the leader's worker list may take.
READ_TIMEOUT_S = 5.0

#: Leader phases whose worker a follower serves too (adds it, calls off its drain).
SERVED_PHASES = frozenset({Phase.JOINING, Phase.READY, Phase.CORDONED, Phase.EJECTED})

#: Leader phases that mean "not cordoned by the operator" (a cordoned follower uncordons).
UNCORDONED_PHASES = frozenset({Phase.JOINING, Phase.READY, Phase.EJECTED})

MirrorKind = Literal["add", "drain", "undrain", "cordon", "uncordon"]


@dataclass(frozen=True)
class LeaderWorker:
    """One worker as the leader lists it: served `model` name, `url` (grpc://host:port),
    `version` label, `phase`."""

    model: str
    url: str
    version: str
    phase: Phase


@dataclass(frozen=True)
class OwnWorker:
    """One worker of the follower's own fleet: served `model` name, `worker_id` (this
    process's), `url`, `phase`."""

    model: str
    worker_id: str
    url: str
    phase: Phase


@dataclass(frozen=True)
class MirrorAction:
    """One change to the follower's fleet. `add` carries the leader's `version` and no
    `worker_id`; the others name the follower's `worker_id` (`version` is "")."""

    kind: MirrorKind
    model: str
    url: str
    version: str = ""
    worker_id: str | None = None


def _canonical(url: str) -> str:
    """`check_worker_url(url)`, or `url` as given when it is malformed (it then matches
    nothing of ours, and its add fails with `InvalidWorker`, logged)."""
    try:
        return check_worker_url(url)
    except ValueError:
        return url


def _rank(phase: Phase) -> int:
    """Which of two leader entries of one URL counts: a served one, then draining, then
    gone (the leader may list a URL twice while an old worker of it leaves)."""
    if phase in SERVED_PHASES:
        return 0
    return 1 if phase is Phase.DRAINING else 2


def mirror_actions(
    leader: Sequence[LeaderWorker], own: Sequence[OwnWorker], *, served: Collection[str]
) -> list[MirrorAction]:
    """The actions that bring `own` (the follower's workers) in step with `leader` (the
    leader's list); `served`: the model names the follower serves.

    Per own worker (own order; `gone` ones are ignored), matched by URL to the leader's
    entry of the same model:
    - none, or draining/gone -> `drain` (unless already draining);
    - served there (joining/ready/cordoned/ejected) and draining here -> `undrain`;
    - cordoned there, ready or ejected here -> `cordon`;
    - joining/ready/ejected there, cordoned here -> `uncordon`.
    Then per leader URL (leader order) served there, of a model in `served` and absent here
    -> `add` with the leader's version. A URL the follower holds under another model is
    drained first and added on a later round, once it has left.
    """
    wanted: dict[str, LeaderWorker] = {}
    for entry in leader:
        url = _canonical(entry.url)
        current = wanted.get(url)
        if current is None or _rank(entry.phase) < _rank(current.phase):
            wanted[url] = entry
    actions: list[MirrorAction] = []
    held: set[str] = set()
    for mine in own:
        if mine.phase is Phase.GONE:
            continue
        url = _canonical(mine.url)
        held.add(url)
        theirs = wanted.get(url)
        if theirs is None or theirs.model != mine.model or theirs.phase not in SERVED_PHASES:
            if mine.phase is not Phase.DRAINING:
                actions.append(_on(mine, "drain"))
        elif mine.phase is Phase.DRAINING:
            actions.append(_on(mine, "undrain"))
        elif theirs.phase is Phase.CORDONED and mine.phase in (Phase.READY, Phase.EJECTED):
            actions.append(_on(mine, "cordon"))
        elif theirs.phase in UNCORDONED_PHASES and mine.phase is Phase.CORDONED:
            actions.append(_on(mine, "uncordon"))
    for url, theirs in wanted.items():
        if theirs.phase in SERVED_PHASES and theirs.model in served and url not in held:
            actions.append(MirrorAction("add", theirs.model, url, theirs.version))
    return actions


def _on(mine: OwnWorker, kind: MirrorKind) -> MirrorAction:
    return MirrorAction(kind, mine.model, mine.url, worker_id=mine.worker_id)


def own_workers(fleet: Fleet) -> list[OwnWorker]:
    """Every worker of `fleet` (models in order) as `mirror_actions` reads it."""
    return [OwnWorker(m.model_id, w.worker_id, w.url, w.phase) for m, w in fleet.workers()]


def leader_workers(response: pb.ListWorkersResponse) -> list[LeaderWorker]:
    """The workers of a `ListWorkers` answer; ValueError for a phase this build does not
    know (the round is skipped rather than guessed at)."""
    return [LeaderWorker(w.model, w.url, w.version, Phase(w.phase)) for w in response.workers]


class LeaderReader:
    """A reader of the leader's worker list over one kept-open channel to `address` (the
    leader's admin API as grpc dials it: "unix:PATH" or "HOST:PORT"; grpc reconnects it
    after a failure): each call is one `ListWorkers` with `authorization: Bearer KEY` when
    `key` is given, at most `timeout_s` seconds. A call raises `grpc.aio.AioRpcError`
    (unreachable, refused, late) or ValueError (`leader_workers`). `close` ends the channel.

    Speaks the generated stubs, not `homing.admin.client`: that client sits above the
    fleet in the layers (docs/architecture.md)."""

    def __init__(self, address: str, *, key: str | None, timeout_s: float) -> None:
        self.address = address
        self._metadata = (("authorization", f"Bearer {key}"),) if key else ()
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.AdminStub | None = None

    async def __call__(self) -> list[LeaderWorker]:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.address)
            self._stub = pb_grpc.AdminStub(self._channel)
        response = await self._stub.ListWorkers(
            pb.ListWorkersRequest(), timeout=self._timeout_s, metadata=self._metadata
        )
        return leader_workers(response)

    async def close(self) -> None:
        """Close the channel (a later call opens another)."""
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()


def leader_reader(
    address: str, *, key: str | None = None, timeout_s: float = READ_TIMEOUT_S
) -> LeaderReader:
    """A `LeaderReader` of the leader's admin API at `address`."""
    return LeaderReader(address, key=key, timeout_s=timeout_s)


class FleetMirror:
    """Keeps `fleet` in step with the leader's list that `read_leader()` returns, every
    `interval_s` seconds of `clock`.

    A failed read is logged (`mirror_read_failed`) and retried next interval; an action the
    fleet refuses (`FleetError`) is logged (`mirror_action_failed`) and the round goes on.
    State changes (drain, undrain, cordon, uncordon) apply at once, with no await between
    the decision and them; adds run concurrently after them (each waits for its worker's
    discovery).
    """

    def __init__(
        self,
        fleet: Fleet,
        read_leader: Callable[[], Awaitable[Sequence[LeaderWorker]]],
        *,
        clock: Clock,
        interval_s: float = 1.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.fleet = fleet
        self.interval_s = interval_s
        self._read_leader = read_leader
        self._clock = clock

    async def run(self) -> None:
        """Mirror forever, one round per `interval_s` (cancel to stop); never raises
        otherwise."""
        while True:
            try:
                leader = await self._read_leader()
            except Exception as err:  # any failed read waits for the next round
                log.warning("mirror_read_failed", error=str(err) or type(err).__name__)
            else:
                try:
                    await self.apply(leader)
                except Exception:  # a bug here must not stop the follower
                    log.exception("mirror_round_failed")
            await self._clock.sleep(self.interval_s)

    async def sync_once(self) -> list[MirrorAction]:
        """One round: read the leader's list and apply what differs; returns the actions
        applied (refused ones left out), state changes first, then adds. Raises what the
        read raises."""
        return await self.apply(await self._read_leader())

    async def apply(self, leader: Sequence[LeaderWorker]) -> list[MirrorAction]:
        """Apply `mirror_actions(leader, <own workers>)` to the fleet; returns the actions
        applied, in decision order."""
        actions = mirror_actions(leader, own_workers(self.fleet), served=self.fleet.models)
        changes = [a for a in actions if a.kind != "add"]
        adds = [a for a in actions if a.kind == "add"]
        applied = [a for a in changes if self._change(a)]
        added = await asyncio.gather(*(self._add(a) for a in adds))
        applied += [a for a, ok in zip(adds, added, strict=True) if ok]
        return applied

    def _change(self, action: MirrorAction) -> bool:
        assert action.worker_id is not None
        operations: dict[str, Callable[[str], object]] = {
            "drain": self.fleet.drain,
            "undrain": self.fleet.undrain,
            "cordon": self.fleet.cordon,
            "uncordon": self.fleet.uncordon,
        }
        try:
            operations[action.kind](action.worker_id)
        except FleetError as err:
            _failed(action, err)
            return False
        _applied(action)
        return True

    async def _add(self, action: MirrorAction) -> bool:
        try:
            state = await self.fleet.add_worker(action.model, action.url, action.version)
        except FleetError as err:
            _failed(action, err)
            return False
        _applied(action, state.worker_id)
        return True


def _applied(action: MirrorAction, worker_id: str | None = None) -> None:
    log.info(
        "mirror_action",
        kind=action.kind,
        model=action.model,
        url=action.url,
        worker=worker_id or action.worker_id,
    )


def _failed(action: MirrorAction, err: FleetError) -> None:
    log.warning(
        "mirror_action_failed",
        kind=action.kind,
        model=action.model,
        url=action.url,
        worker=action.worker_id,
        code=err.code,
        error=str(err),
    )
