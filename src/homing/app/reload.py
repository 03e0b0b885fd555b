"""Reload: serve a new configuration in place, without dropping a request.

Rule of the file: it carries out a plan, it does not make one. What may change, and why a
change is refused, is the pure `homing.config.reload_plan` (`plan_reload`, `ReloadPlan`);
this module adds only what the running process knows (which workers are ready, draining,
or were added through the admin API) and applies the plan: tenants, routing, SLOs,
timeouts, retries and admin keys in place with no await between them, then the listed
workers (removed ones drain, added ones join, draining ones listed again serve again).
"""

from __future__ import annotations

import asyncio
from typing import get_args

import structlog

from homing.app.parts import AppParts, model_router_settings, slo_of
from homing.config import HomingConfig, TenantSettings
from homing.config.reload_plan import ReloadPlan, plan_reload
from homing.config.reload_plan import refusal as reload_refusal
from homing.engines.lifecycle import Phase
from homing.engines.pool import WorkerState
from homing.fleet import ModelDispatch
from homing.fleet.fleet import FleetError
from homing.gateway.quotas.types import QuotaKind
from homing.gateway.retry_budget import RetryPolicy
from homing.router.settings import policy_configs

log = structlog.get_logger("homing.app")


class Reloading(AppParts):
    """The reload of an `App`: `reload` and the steps it takes."""

    async def reload(self, new: HomingConfig) -> ReloadPlan:
        """Serve `new` from now on without dropping a request (`homing.config.reload_plan`
        says what may change). Requests already routed keep what they were admitted under;
        removed workers drain; a listed worker still draining from an earlier reload serves
        again. Everything that can be checked is checked before anything is applied:
        `ReloadRefused` (nothing applied) when `new` needs a restart or cannot be served
        as it is (a URL another model has, a model left with fewer ready workers than
        `daemon.min_ready_workers`). Returns the plan with what became of the added
        workers (`ReloadPlan.outcome`): one its pool refuses (another model or tokenizer)
        is dropped and named in `failed`, one not reachable yet stays joining and joins
        when it answers, as at startup."""
        if self.fleet is None or self.service is None:
            raise ReloadRefused("the gateway is not serving yet")
        plan = plan_reload(self.config, new)
        if not plan.applies:
            raise ReloadRefused(plan.refusal())
        if plan.empty:
            return plan
        steps = self._worker_steps(plan, new)  # ReloadRefused before anything is applied
        # Every in-place change first, with no await between: requests see old or new.
        if plan.tenants:
            self._reload_tenants(new.tenants)
        if plan.routing:
            self._reload_routing(new)
        if plan.slo:
            self._reload_slos(new)
        if plan.timeouts:
            self.service.request_timeout_s = new.gateway.request_timeout_s
            self.fleet.drain_timeout_s = new.gateway.drain_timeout_s
        if plan.retries:
            self.service.configure_retries(
                RetryPolicy.from_router(new.router), migrate_streams=new.router.migrate_streams
            )
        if self.admin is not None and (plan.admin_keys or plan.tenants):
            self.admin.update(tenants=new.tenants, keys=new.admin.keys, quotas=self.quotas)
        self.config = new
        return await self._reload_workers(plan, steps, new)

    def _reload_tenants(self, tenants: list[TenantSettings]) -> None:
        """New keys and quotas; the plan keeps authentication on (or off) as it was."""
        assert self.keyring is not None
        self.gateway_metrics.start_at_zero((t.name for t in tenants), get_args(QuotaKind))
        self.keyring.replace(tenants)

    def _reload_routing(self, new: HomingConfig) -> None:
        assert self.fleet is not None
        specs = zip(self.config.served_models(), new.served_models(), strict=True)
        for (was, spec), m in zip(specs, self.fleet.models.values(), strict=True):
            before = policy_configs(
                model_router_settings(self.config.router, was),
                m.model_id,
                max_in_flight=self.config.admission.max_in_flight_per_replica,
            )
            after = policy_configs(
                model_router_settings(new.router, spec),
                m.model_id,
                max_in_flight=new.admission.max_in_flight_per_replica,
            )
            policy, cache_aware, consistent_hash = after
            if after != before:  # a new policy starts with fresh state (its ring, counters)
                m.router.set_policy(
                    policy, cache_aware=cache_aware, consistent_hash=consistent_hash
                )
                log.info("router_policy_reloaded", model=m.model_id, policy=policy)
            admission = self.admissions.get(m.model_id)
            if admission is not None:
                admission.thresholds = cache_aware.overload

    def _reload_slos(self, new: HomingConfig) -> None:
        assert self.fleet is not None
        self.recorder.default_slo = slo_of(new.slo)
        for spec, m in zip(new.served_models(), self.fleet.models.values(), strict=True):
            self.recorder.set_slo(m.model_id, slo_of(spec.slo or new.slo))

    def _worker_steps(self, plan: ReloadPlan, new: HomingConfig) -> list[_WorkerSteps]:
        """What the plan's worker changes do to the live pools; `ReloadRefused` naming every
        problem when an added URL belongs to another model or has another version, or a
        model would keep fewer ready workers than `daemon.min_ready_workers`."""
        assert self.fleet is not None
        models = list(self.fleet.models.values())
        owners = {w.url: (m, w) for m, w in self.fleet.workers()}
        minimum = new.daemon.min_ready_workers
        problems: list[str] = []
        out: list[_WorkerSteps] = []
        for change in plan.workers:
            m = models[change.model_index]
            steps = _WorkerSteps(m)
            removed = set(change.removed)
            leaving = [w for w in m.workers() if w.url in removed and not w.draining]
            steps.drains = [w.worker_id for w in leaving]
            back: list[WorkerState] = []
            for url, version in change.added:
                owner, w = owners.get(url, (None, None))
                if owner is None or w is None:
                    steps.adds.append((url, version))
                elif owner is not m:
                    problems.append(
                        f"worker {url} is worker {w.worker_id} of model {owner.model_id!r}; "
                        f"it can join model {m.model_id!r} once it has left that one"
                    )
                elif w.version != version:
                    problems.append(
                        f"worker {url} is already worker {w.worker_id} with version "
                        f"{w.version!r}, not {version!r}; remove it and list it again once "
                        "it has left"
                    )
                elif w.undrainable:
                    steps.rejoins.append(w.worker_id)
                    back.append(w)
                elif w.draining:
                    problems.append(
                        f"worker {url} is worker {w.worker_id}, draining since it was "
                        f"{w.drained_from.value if w.drained_from else 'joining'}; list it "
                        "again once it has left"
                    )
                # else: added through the admin API, listed from now on; it stays as it is
            lost = sum(1 for w in leaving if w.routable)
            left = m.ready_workers - lost + sum(1 for w in back if _ready_once_back(w))
            if lost and left < minimum:
                hint = (
                    "the workers it adds are not ready yet: add them in one reload and "
                    "remove the old ones in the next, once they serve"
                    if steps.adds
                    else "keep more of its workers listed"
                )
                problems.append(
                    f"model {m.model_id!r} would be left with {left} ready "
                    f"{'worker' if left == 1 else 'workers'}, fewer than "
                    f"daemon.min_ready_workers ({minimum}); {hint}"
                )
            out.append(steps)
        if problems:
            raise ReloadRefused(reload_refusal(rejected=tuple(problems)))
        return out

    async def _reload_workers(
        self, plan: ReloadPlan, steps: list[_WorkerSteps], new: HomingConfig
    ) -> ReloadPlan:
        """Serve the draining workers listed again, drain the removed ones (they finish
        every request: the drain may last as long as a request may) and add the new ones
        concurrently; the plan with what became of each."""
        assert self.fleet is not None
        rejoined: list[str] = []
        adds = []
        for s in steps:
            for worker_id in s.rejoins:
                state = self.fleet.undrain(worker_id)
                rejoined.append(state.url)
                log.info("worker_reload_undrain", model=s.model.model_id, worker=worker_id)
            for worker_id in s.drains:
                self.fleet.drain(worker_id, timeout_s=new.gateway.request_timeout_s)
                log.info("worker_reload_drain", model=s.model.model_id, worker=worker_id)
            adds += [self._reload_add(s.model.model_id, url, version) for url, version in s.adds]
        results = await asyncio.gather(*adds)
        failed = tuple((url, why) for url, why, _ in results if why is not None)
        joining = tuple(
            url for url, _, state in results if state is not None and state.phase is Phase.JOINING
        )
        return plan.with_results(failed=failed, joining=joining, rejoined=tuple(rejoined))

    async def _reload_add(
        self, model: str, url: str, version: str
    ) -> tuple[str, str | None, WorkerState | None]:
        """Add one listed worker: (url, why it did not join or None, its state or None)."""
        assert self.fleet is not None
        try:
            state = await self.fleet.add_worker(model, url, version)
        except FleetError as err:
            log.error("worker_reload_add_failed", model=model, url=url, error=str(err))
            return url, str(err), None
        log.info(
            "worker_reload_added",
            model=model,
            worker=state.worker_id,
            url=url,
            phase=state.phase.value,
        )
        return url, None, state


class _WorkerSteps:
    """One model's worker changes against its live pool: worker ids to `drains` and to
    serve again (`rejoins`), and (url, version) to `adds`."""

    def __init__(self, model: ModelDispatch) -> None:
        self.model = model
        self.drains: list[str] = []
        self.rejoins: list[str] = []
        self.adds: list[tuple[str, str]] = []


def _ready_once_back(w: WorkerState) -> bool:
    """Whether a draining worker would take requests as soon as it serves again."""
    return w.drained_from is Phase.READY and w.admits


class ReloadRefused(Exception):
    """A reload that was not applied; the message says why and what to do."""
