"""The rollout controller: each served model's version split and rollout, run live.

Rule of this file: the imperative shell around the pure parts. It feeds each ended request
to its model's `VersionWindow` (`record`, `record_failed_attempt`), takes a verdict for
every active rollout each `tick_s` (`tick`: `compare` over the current step's samples,
then `Rollout.observe`), applies what the rollout asks (the model's `VersionSplit`; on a
rollback, the canary's workers drained or kept as `on_rollback` says) and stores the model's
split and rollout after each change, so a restarted gateway resumes where it was
(`restore`). The split last set at runtime (by a rollout or `set_split`) wins over the
config's `versions` until `reset_split`, or a restart with other `versions` in the config.

Several instances on one shared store (Redis): each change is written over the revision
this instance last saw (`RolloutStore.save`), and every tick and operation first follows
what the others wrote (`sync`). So only one instance moves a rollout a step; a change that
lost the race is dropped, or refused to the operator, and the store's state is followed. A
failing verdict rolls back locally at once even when the store cannot be written (it is
stored at a later tick); a passing one moves on only once stored.

Errors of the operations are `FleetError`s (their `code` is the admin API's status):
`UnknownModel`, `RolloutRefused` (FAILED_PRECONDITION: the phase or the pool does not allow
it), `InvalidRollout` (INVALID_ARGUMENT), `RolloutUnavailable` (UNAVAILABLE: the store
failed, and the change was not applied here).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from homing.clock import Clock, SystemClock
from homing.config import check_version_label
from homing.engines.lifecycle import Phase
from homing.fleet import Fleet, FleetError, ModelDispatch
from homing.obs.requests import RequestDone
from homing.rollout.compare import (
    Sample,
    Verdict,
    VerdictRule,
    VersionStats,
    VersionWindow,
    compare,
)
from homing.rollout.metrics import RolloutMetrics
from homing.rollout.plan import Rollout, RolloutError, check_steps
from homing.rollout.store import RolloutStore, RolloutStoreError, revision_of
from homing.router.versions import VersionSplit

log = structlog.get_logger("homing.rollout")

#: The comparison figures exported per version (`RolloutMetrics.figures` keys) and the
#: `VersionStats` attribute each comes from.
_FIGURES = (
    ("attainment", "attainment"),
    ("error_ratio", "error_rate"),
    ("ttft_per_uncached_token_seconds", "ttft_per_uncached_token_s"),
    ("tpot_p50_seconds", "tpot_p50_s"),
)


class RolloutRefused(FleetError):
    """The rollout's phase or the model's pool does not allow the operation."""

    code = "FAILED_PRECONDITION"


class InvalidRollout(FleetError):
    """A malformed version, weight, step list or bake time."""

    code = "INVALID_ARGUMENT"


class RolloutUnavailable(FleetError):
    """The rollout store could not be read or written; the change was not applied here."""

    code = "UNAVAILABLE"


@dataclass(frozen=True)
class RolloutConfig:
    """`steps` / `bake_s`: the defaults of `start`; `window_s`: the comparison's window;
    `rule`: the verdict's; `on_rollback`: "drain" or "keep" the canary's workers;
    `tick_s`: seconds between verdicts; `drain_timeout_s`: a rolled-back canary worker's
    drain timeout (above the longest request, so none of its streams is cut)."""

    steps: tuple[float, ...] = (5.0, 25.0, 50.0, 100.0)
    bake_s: float = 600.0
    window_s: float = 600.0
    rule: VerdictRule = field(default_factory=VerdictRule)
    on_rollback: str = "drain"
    tick_s: float = 1.0
    drain_timeout_s: float = 630.0


@dataclass(frozen=True)
class RolloutStatus:
    """A model's rollout now: the rollout (None: never one), the seconds its step has
    baked, the comparison's stats of both versions over the current step and the verdict
    they give (None without an active rollout)."""

    model: str
    split: dict[str, float] | None
    rollout: Rollout | None
    baked_s: float
    baseline: VersionStats | None
    canary: VersionStats | None
    verdict: Verdict | None


class RolloutController:
    """Version splits and rollouts of `fleet`'s models (module docstring).

    `config_splits`: each model's split from the config (None: unsplit). `store`: where
    splits and rollouts outlive the process. `clock`: what `run` sleeps on; rollouts and
    samples are timed on its `wall` (Unix seconds: they outlive the process). `metrics`:
    None exports nothing.
    """

    def __init__(
        self,
        fleet: Fleet,
        config: RolloutConfig,
        store: RolloutStore,
        *,
        config_splits: Mapping[str, Mapping[str, float] | None] | None = None,
        clock: Clock | None = None,
        metrics: RolloutMetrics | None = None,
    ) -> None:
        self.fleet = fleet
        self.config = config
        self.store = store
        self._clock = clock or SystemClock()
        self._wall = self._clock.wall
        self.metrics = metrics
        self._config_splits = {k: dict(v) if v else None for k, v in (config_splits or {}).items()}
        self.rollouts: dict[str, Rollout] = {}
        # Room for 20 times the verdict's sample (5,000 at the defaults) per version.
        room = max(5_000, 20 * config.rule.min_requests)
        self.windows: dict[str, VersionWindow] = {
            name: VersionWindow(config.window_s, room) for name in fleet.models
        }
        self._exported: dict[str, set[str]] = {}
        self._revisions: dict[str, str] = {}  # the stored revision each model's state came from
        self._unsaved: set[str] = set()
        self._lock = asyncio.Lock()
        for name, model in fleet.models.items():
            split = self._config_splits.get(name)
            self._set_split(model, VersionSplit(split) if split else None)

    # -- intake (the request path: no awaits) --

    def record(self, r: RequestDone, verdict: str | None) -> None:
        """Add an ended request to its model's window under the version that served it,
        while the model has an active rollout and the version is one of its two (requests
        never routed, pinned to a version, outside the SLO such as those the client left, or
        of an unknown model are left out)."""
        rollout = self.rollouts.get(r.model)
        if rollout is None or not rollout.active or r.pinned or r.queue_s is None:
            return
        if verdict is None:  # the client's doing (it left, or asked badly): not the version's
            return
        if r.version != rollout.canary and r.version != rollout.baseline:
            return
        window = self.windows.get(r.model)
        if window is None:
            return
        uncached = max(0, r.prompt_tokens - r.cached_tokens)
        window.add(
            r.version,
            Sample(
                at=self._wall(),
                verdict=verdict,
                ttft_s=r.routed_ttft_s,
                uncached_tokens=uncached,
                tpot_s=r.tpot_s,
                completion_tokens=r.completion_tokens,
                finish_reason=r.finish_reason,
            ),
        )

    def record_failed_attempt(self, model_id: str, worker_id: str) -> None:
        """A worker failed its part of a request that went on elsewhere (retried or
        migrated): a failed sample of that worker's version, so a canary's failures count
        even when the baseline saved the request."""
        window = self.windows.get(model_id)
        model = self.fleet.models.get(model_id)
        rollout = self.rollouts.get(model_id)
        if window is None or model is None or not model.pool.has(worker_id):
            return
        if rollout is None or not rollout.active:
            return
        version = model.pool.state(worker_id).version
        window.add(version, Sample(self._wall(), "failed", None, 0, None, 0, ""))

    # -- the loop --

    async def restore(self) -> None:
        """Apply the stored splits and rollouts of the served models. `RolloutStoreError`
        when a served model's entry cannot be read (a restart must not forget a rollback),
        or the file store cannot be. A shared store (Redis) that cannot be reached is
        logged and the config's splits serve: the quotas on that Redis let the gateway start
        too, and every tick follows the store once it answers."""
        try:
            stored = await self.store.load()
        except RolloutStoreError as err:
            if not self.store.shared:
                raise
            log.warning("rollout_store_unavailable", operation="start", error=str(err))
            return
        await self.sync(announce=False, stored=stored)

    async def sync(
        self, *, announce: bool = True, stored: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """Follow what the store holds where its revision differs from this instance's (the
        store is the truth: another instance's change, or a store that was emptied);
        `announce`: log it and, for a rollback, drain as this instance would. A rollback of
        ours not yet stored is made again on top of what is followed, and a model whose
        entry vanished has its state written again. `RolloutStoreError` when the store
        cannot be read (or, at `restore`, a served model's entry cannot). `stored`: what
        the store holds, when already read."""
        if stored is None:
            stored = await self.store.load()
        for name in self.fleet.models:
            if name not in stored and self._revisions.get(name, ""):
                log.warning("rollout_entry_vanished", model=name, revision=self._revisions[name])
                self._revisions[name] = ""  # written again at the tick, over nothing
                self._unsaved.add(name)
        for name, data in stored.items():
            model = self.fleet.models.get(name)
            if model is None:
                if not announce:
                    log.warning("rollout_not_restored", model=name, reason="model not served")
                continue
            revision = revision_of(data)
            if revision == self._revisions.get(name, "") and announce:
                continue
            try:
                if "unreadable" in data:
                    raise ValueError(data["unreadable"])
                split = data.get("split")
                rollout = Rollout.from_dict(data["rollout"]) if data.get("rollout") else None
                if rollout is not None and rollout.model != name:
                    raise ValueError(f"it holds a rollout of model {rollout.model!r}")
                restored = VersionSplit(split) if split else None
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                if not announce:  # a restart must not forget a rollback: refuse to start
                    raise RolloutStoreError(
                        f"{self.store.where}: the stored state of {name!r} cannot be read "
                        f"({err}); fix it, or remove it to start from the config"
                    ) from None
                log.error("rollout_not_followed", model=name, reason=str(err))
                continue
            self._revisions[name] = revision
            mine = self.rollouts.get(name)
            if name in self._unsaved and _rebases(mine, rollout):
                assert mine is not None and rollout is not None
                rollout.rollback(self._wall(), mine.reason)  # the safety net wins
                restored = VersionSplit(rollout.weights())
            else:
                self._unsaved.discard(name)
            if not announce and self._config_wins(name, data, rollout):
                configured = self._config_splits.get(name)
                log.info(
                    "version_split_from_config", model=name, stored=split, configured=configured
                )
                restored = VersionSplit(configured) if configured else None
                self._unsaved.add(name)  # stored with the config it came from at the tick
            if rollout is not None:
                self.rollouts[name] = rollout
                self._export_phase(rollout)
            else:
                self.rollouts.pop(name, None)
            self._set_split(model, restored)
            if announce and rollout is not None and not rollout.active:
                if mine is not None and mine.active:  # it ended elsewhere: end it here too
                    self._ended(rollout)
            log.info(
                "rollout_followed" if announce else "rollout_restored",
                model=name,
                revision=revision,
                split=restored.weights if restored else None,
                canary=rollout.canary if rollout else None,
                phase=rollout.phase if rollout else None,
                step_weight=rollout.weight if rollout else None,
            )

    def _config_wins(self, name: str, data: dict[str, Any], rollout: Rollout | None) -> bool:
        """At restore: the config's split changed since the stored one was set, no rollout
        is active, and it would not give a rolled-back canary kept for inspection traffic."""
        configured = self._config_splits.get(name)
        if (rollout is not None and rollout.active) or "configured" not in data:
            return False
        if data["configured"] == configured:
            return False
        if rollout is not None and rollout.phase == "rolled_back":
            model = self.fleet.models[name]
            kept = any(w.version == rollout.canary for w in model.workers())
            if kept and (configured is None or configured.get(rollout.canary, 0) > 0):
                log.warning(
                    "version_split_from_config_refused",
                    model=name,
                    reason=f"it would give the rolled-back canary {rollout.canary} traffic",
                )
                return False
        return True

    async def run(self) -> None:
        """Take verdicts every `tick_s` until cancelled."""
        while True:
            await self._clock.sleep(self.config.tick_s)
            try:
                await self.tick()
            except Exception:  # a fault of ours must not end rollouts' safety net
                log.exception("rollout_tick_failed")

    async def tick(self) -> None:
        """Follow the shared store, then one verdict per active rollout, applied and stored
        when it changes something (module docstring); stores that failed earlier are tried
        again."""
        async with self._lock:
            if self.store.shared:
                try:
                    await self.sync()
                except RolloutStoreError as err:
                    log.warning("rollout_store_unreadable", error=str(err))
            now = self._wall()
            for name, rollout in list(self.rollouts.items()):
                if not rollout.active or name in self._unsaved:
                    continue
                if self.rollouts.get(name) is not rollout:  # followed meanwhile: judge anew
                    continue
                try:
                    await self._judge(name, rollout, now)
                except Exception:  # one model's fault must not stop the others' verdicts
                    log.exception("rollout_tick_failed", model=name)
            for name in sorted(self._unsaved):
                await self._save_quietly(name)

    async def _judge(self, name: str, rollout: Rollout, now: float) -> None:
        """One verdict of an active rollout, applied (and stored) when it changes it."""
        verdict = self._verdict(rollout, now)
        if self.metrics is not None:
            self.metrics.verdicts.labels(name, verdict.result).inc()
            self._export_figures(name, (verdict.baseline, verdict.canary))
        changed = Rollout.from_dict(rollout.to_dict())
        if not changed.observe(now, verdict.result, verdict.reason):
            rollout.last_verdict = changed.last_verdict
            return
        rolled_back = changed.phase == "rolled_back"
        if rolled_back:  # safety first: at once, stored or not
            failed = next((c.name for c in verdict.checks if c.result == "fail"), "")
            self._count_rollback(name, failed or "verdict")
            self.rollouts[name] = changed
            await self._apply(changed)
            self._unsaved.add(name)
            return
        try:
            stored = await self._save(name, changed, VersionSplit(changed.weights()))
        except RolloutUnavailable as err:
            log.error("rollout_store_failed", model=name, error=str(err))
            return
        if stored:
            self.rollouts[name] = changed
            await self._apply(changed)

    # -- operations (the admin API's) --

    async def start(
        self,
        model_id: str,
        canary: str,
        steps: Sequence[float] | None = None,
        bake_s: float | None = None,
    ) -> Rollout:
        """Start rolling `canary` out on `model_id` against the one version serving now.
        `RolloutRefused` when a rollout is active, no ready worker carries `canary`, or not
        exactly one other version serves; `InvalidRollout` for bad steps or bake time."""
        async with self._lock:
            model = self.fleet.model(model_id)
            await self._follow()
            current = self.rollouts.get(model_id)
            if current is not None and current.active:
                raise RolloutRefused(
                    f"a rollout of {current.canary} is {current.phase} on {model_id}: promote "
                    f"or roll it back first (homing rollout status {model_id})"
                )
            try:
                check_version_label(canary)
            except ValueError as err:
                raise InvalidRollout(str(err)) from None
            ready = {w.version for w in model.pool.routable_workers()}
            if canary not in ready:
                raise RolloutRefused(
                    f"no ready worker of {model_id} carries version {canary!r}: add one first "
                    f"(homing workers add {model_id} URL --version {canary})"
                )
            serving = self._serving(model) - {canary}
            if len(serving) != 1:
                listed = ", ".join(repr(v) for v in sorted(serving)) or "none"
                raise RolloutRefused(
                    f"a rollout needs exactly one baseline version serving {model_id}; "
                    f"serving now: {listed} (set one with homing versions set)"
                )
            (baseline,) = serving
            try:
                rollout = Rollout.start(
                    model_id,
                    baseline,
                    canary,
                    self.config.steps if steps is None else steps,
                    self.config.bake_s if bake_s is None else bake_s,
                    now=self._wall(),
                )
            except ValueError as err:
                raise InvalidRollout(str(err)) from None
            await self._save_or_refuse(model_id, rollout, VersionSplit(rollout.weights()))
            self.windows[model_id].clear()
            self.rollouts[model_id] = rollout
            await self._apply(rollout)
            return rollout

    async def pause(self, model_id: str) -> Rollout:
        """Hold the model's rollout at its step (`RolloutRefused` unless running)."""
        return await self._change(model_id, lambda r, now: r.pause(now))

    async def resume(self, model_id: str) -> Rollout:
        """Go on from a pause (`RolloutRefused` unless paused)."""
        return await self._change(model_id, lambda r, now: r.resume(now))

    async def promote(self, model_id: str) -> Rollout:
        """Give the canary 100% now (`RolloutRefused` unless running or paused, or while
        no ready worker carries the canary)."""

        def promote(r: Rollout, now: float) -> None:
            if r.active and not self._canary_ready(r):
                raise RolloutRefused(
                    f"no ready worker of {model_id} carries the canary {r.canary}: promoting "
                    "it would leave every request without a replica"
                )
            r.promote(now)

        return await self._change(model_id, promote)

    async def rollback(self, model_id: str) -> Rollout:
        """Give the canary 0% now (`RolloutRefused` unless running or paused)."""
        rollout = await self._change(model_id, lambda r, now: r.rollback(now))
        self._count_rollback(model_id, "operator")
        return rollout

    async def set_split(self, model_id: str, weights: Mapping[str, float]) -> VersionSplit:
        """Set the model's split by hand (`RolloutRefused` while a rollout is active or
        when no worker carries a version it gives weight; `InvalidRollout` for bad labels or
        weights)."""
        async with self._lock:
            model = self.fleet.model(model_id)
            await self._follow()
            self._refuse_if_active(model_id, "set the split")
            try:
                for label in weights:
                    check_version_label(label)
                split = VersionSplit(weights)
            except ValueError as err:
                raise InvalidRollout(str(err)) from None
            carried = {w.version for w in model.workers()}
            missing = sorted(v for v, w in split.weights.items() if w > 0 and v not in carried)
            if missing:
                listed = ", ".join(repr(v) for v in sorted(carried)) or "none"
                raise RolloutRefused(
                    f"no worker of {model_id} carries version {missing[0]!r} (versions: "
                    f"{listed}): add one first, or give it weight 0"
                )
            await self._save_or_refuse(model_id, self.rollouts.get(model_id), split)
            self._set_split(model, split)
            log.info("version_split_set", model=model_id, split=split.weights)
            return split

    async def reset_split(self, model_id: str) -> VersionSplit | None:
        """Return the model to its config's split (`RolloutRefused` while a rollout is
        active, or when that would give a rolled-back canary's ready workers traffic again);
        returns it (None: unsplit)."""
        async with self._lock:
            model = self.fleet.model(model_id)
            await self._follow()
            self._refuse_if_active(model_id, "reset the split")
            configured = self._config_splits.get(model_id)
            split = VersionSplit(configured) if configured else None
            last = self.rollouts.get(model_id)
            if last is not None and last.phase == "rolled_back":
                ready = {w.version for w in model.pool.routable_workers()}
                gets = split is None or split.weights.get(last.canary, 0) > 0
                if gets and last.canary in ready:
                    raise RolloutRefused(
                        f"the config's split would give the rolled-back canary {last.canary} "
                        "traffic again: remove its workers first (homing workers rm ID), or "
                        "set the split (homing versions set)"
                    )
            await self._save_or_refuse(model_id, self.rollouts.get(model_id), split)
            self._set_split(model, split)
            log.info("version_split_reset", model=model_id, split=configured)
            return split

    def status(self, model_id: str) -> RolloutStatus:
        """The model's rollout now (`UnknownModel`)."""
        model = self.fleet.model(model_id)
        split = model.split.weights if model.split is not None else None
        rollout = self.rollouts.get(model_id)
        if rollout is None:
            return RolloutStatus(model_id, split, None, 0.0, None, None, None)
        now = self._wall()
        verdict = self._verdict(rollout, now) if rollout.active else None
        window = self.windows[model_id]
        since = rollout.step_started_at
        return RolloutStatus(
            model_id,
            split,
            rollout,
            rollout.baked_s(now),
            verdict.baseline if verdict else window.stats(rollout.baseline, now, since),
            verdict.canary if verdict else window.stats(rollout.canary, now, since),
            verdict,
        )

    # -- helpers --

    def _verdict(self, rollout: Rollout, now: float) -> Verdict:
        """The comparison of the current step; while no ready worker carries the canary it
        is a wait that says so first (a pass would move all of a step's share, or at 100
        every request, to no replica)."""
        window = self.windows[rollout.model]
        # Both versions over the same span: a busy baseline that filled its samples has
        # figures from its oldest kept one on, so the canary's are taken from there too.
        starts = [window.full_since(v) for v in (rollout.baseline, rollout.canary)]
        since = max([rollout.step_started_at, *(t for t in starts if t is not None)])
        verdict = compare(
            window.stats(rollout.baseline, now, since),
            window.stats(rollout.canary, now, since),
            self.config.rule,
        )
        if verdict.result != "fail" and not self._canary_ready(rollout):
            reason = f"no ready worker carries the canary {rollout.canary}; {verdict.reason}"
            return replace(verdict, result="wait", reason=reason)
        return verdict

    def _canary_ready(self, rollout: Rollout) -> bool:
        model = self.fleet.models[rollout.model]
        return any(w.version == rollout.canary for w in model.pool.routable_workers())

    def _serving(self, model: ModelDispatch) -> set[str]:
        """The versions taking unpinned requests now: the split's weighted ones with a ready
        worker, or every ready worker's without a split."""
        ready = {w.version for w in model.pool.routable_workers()}
        if model.split is None:
            return ready
        return {v for v, w in model.split.weights.items() if w > 0 and v in ready}

    def _refuse_if_active(self, model_id: str, what: str) -> None:
        current = self.rollouts.get(model_id)
        if current is not None and current.active:
            raise RolloutRefused(
                f"a rollout of {current.canary} is {current.phase} on {model_id}: cannot {what} "
                "until it is promoted or rolled back"
            )

    async def _change(self, model_id: str, change: Callable[[Rollout, float], None]) -> Rollout:
        async with self._lock:
            self.fleet.model(model_id)
            await self._follow()
            rollout = self.rollouts.get(model_id)
            if rollout is None:
                raise RolloutRefused(f"{model_id} has no rollout (start one: homing rollout start)")
            changed = Rollout.from_dict(rollout.to_dict())
            try:
                change(changed, self._wall())
            except RolloutError as err:
                raise RolloutRefused(str(err)) from None
            await self._save_or_refuse(model_id, changed, VersionSplit(changed.weights()))
            self.rollouts[model_id] = changed
            await self._apply(changed)
            return changed

    async def _apply(self, rollout: Rollout) -> None:
        """Give the model the split `rollout` asks for; a rollback also drains the canary's
        workers (unless they are kept); log and export the change."""
        model = self.fleet.models[rollout.model]
        self._set_split(model, VersionSplit(rollout.weights()))
        self._export_phase(rollout)
        if not rollout.active:
            self._ended(rollout)
        event = rollout.history[-1].event if rollout.history else rollout.phase
        emit = log.warning if rollout.phase == "rolled_back" else log.info
        emit(
            f"rollout_{event}",
            model=rollout.model,
            canary=rollout.canary,
            baseline=rollout.baseline,
            phase=rollout.phase,
            weight=rollout.weight,
            reason=rollout.reason or None,
        )

    def _ended(self, rollout: Rollout) -> None:
        """A rollout ended (here or elsewhere): drop its samples and figures; a rollback
        drains the canary."""
        self.windows[rollout.model].clear()
        if self.metrics is not None:
            self.metrics.clear_figures(rollout.model)
        if rollout.phase == "rolled_back":
            self._drain_canary(rollout)

    def _drain_canary(self, rollout: Rollout) -> None:
        """Drain the rolled-back canary's workers, unless `on_rollback` keeps them."""
        if self.config.on_rollback != "drain":
            return
        for w in self.fleet.models[rollout.model].workers():
            if w.version == rollout.canary and w.phase in (Phase.READY, Phase.CORDONED):
                try:
                    self.fleet.drain(w.worker_id, self.config.drain_timeout_s)
                except FleetError as err:
                    log.warning("rollout_drain_failed", worker=w.worker_id, error=str(err))

    def _set_split(self, model: ModelDispatch, split: VersionSplit | None) -> None:
        model.split = split
        if self.metrics is not None:
            before = self._exported.get(model.model_id, set())
            shares = split.shares() if split is not None else {}
            self._exported[model.model_id] = self.metrics.set_split(model.model_id, shares, before)

    async def _save(
        self, model_id: str, rollout: Rollout | None, split: VersionSplit | None
    ) -> bool:
        """Store the model's state over the revision last seen; False when another
        instance wrote first (this instance then follows the store). `RolloutUnavailable`
        when the store failed."""
        revision = self._revisions.get(model_id, "")
        new_revision = uuid.uuid4().hex
        data: dict[str, Any] = {
            "revision": new_revision,
            "configured": self._config_splits.get(model_id),
            "split": split.weights if split is not None else None,
            "rollout": rollout.to_dict() if rollout is not None else None,
            "saved_at": self._wall(),
        }
        try:
            written = await self.store.save(model_id, data, revision)
        except RolloutStoreError as err:
            raise RolloutUnavailable(
                f"the rollout store failed, so the change was not applied (a write that timed "
                f"out may still land: see homing rollout status): {err}"
            ) from None
        if not written:
            log.info("rollout_changed_elsewhere", model=model_id, revision=revision)
            await self._follow()
            return False
        self._revisions[model_id] = new_revision
        self._unsaved.discard(model_id)
        return True

    async def _save_or_refuse(
        self, model_id: str, rollout: Rollout | None, split: VersionSplit | None
    ) -> None:
        """`_save` for an operator's change: `RolloutRefused` when another instance
        changed the model's state first."""
        if not await self._save(model_id, rollout, split):
            raise RolloutRefused(
                f"another gateway instance changed {model_id}'s rollout meanwhile: see "
                f"homing rollout status {model_id}, then try again"
            )

    async def _follow(self) -> None:
        """`sync` with a shared store (no-op otherwise); `RolloutUnavailable` when it
        cannot be read."""
        if not self.store.shared:
            return
        try:
            await self.sync()
        except RolloutStoreError as err:
            raise RolloutUnavailable(f"the rollout store cannot be read: {err}") from None

    async def _save_quietly(self, model_id: str) -> None:
        """Store a change the loop made; on failure log it and try again next tick (a
        rollback that lost the race to another instance's write was made again on top of it
        by `sync`, and is stored then)."""
        model = self.fleet.models[model_id]
        try:
            await self._save(model_id, self.rollouts.get(model_id), model.split)
        except RolloutUnavailable as err:
            log.error("rollout_store_failed", model=model_id, error=str(err))

    def _count_rollback(self, model_id: str, check: str) -> None:
        if self.metrics is not None:
            self.metrics.rollbacks.labels(model_id, check).inc()

    def _export_phase(self, rollout: Rollout) -> None:
        if self.metrics is not None:
            self.metrics.set_phase(rollout.model, rollout.canary, rollout.phase, rollout.weight)

    def _export_figures(self, model_id: str, stats: Sequence[VersionStats]) -> None:
        assert self.metrics is not None
        for s in stats:
            for name, attr in _FIGURES:
                self.metrics.set_figure(name, model_id, s.version, getattr(s, attr))


def config_of(settings: Any, request_timeout_s: float = 600.0) -> RolloutConfig:
    """The `RolloutConfig` of a `homing.config.RolloutSettings`; a rolled-back canary's
    drain outlasts `request_timeout_s` (`gateway.request_timeout_s`) by 30 s."""
    return RolloutConfig(
        steps=tuple(check_steps(settings.steps)),
        bake_s=settings.bake_s,
        window_s=settings.window_s,
        rule=VerdictRule(
            min_requests=settings.min_requests,
            attainment_margin=settings.attainment_margin,
            error_margin=settings.error_margin,
            latency_margin=settings.latency_margin,
            min_latency_samples=settings.min_latency_samples,
        ),
        on_rollback=settings.on_rollback,
        tick_s=settings.tick_s,
        drain_timeout_s=request_timeout_s + 30.0,
    )


def _rebases(mine: Rollout | None, theirs: Rollout | None) -> bool:
    """Our unstored rollback is to be made again on `theirs`: the same rollout (canary,
    baseline and start), still active there."""
    return (
        mine is not None
        and theirs is not None
        and mine.phase == "rolled_back"
        and theirs.active
        and (mine.canary, mine.baseline) == (theirs.canary, theirs.baseline)
        and bool(mine.history)
        and bool(theirs.history)
        and mine.history[0].at == theirs.history[0].at
    )
