"""What a configuration reload changes: the pure difference of two validated configs.

Rule of the file: no I/O, no event loop, no clock. `plan_reload(old, new)` says what the
running process must do to serve `new`, or why it cannot without a restart; `homing.app.reload`
carries the plan out. A reload is all or nothing: when any setting outside `RELOADABLE`
differs (listeners, the quota store, the engines homing starts, the served models, the
index's block size, ...), the plan is refused and nothing is applied.

Reloadable in place: tenants and their keys and quotas, the admin keys, the routing policy
and its weights and bounds (router-wide and per model), retries and stream migration, the
SLOs, the request and drain timeouts, and the listed workers of each served model (added
ones join, removed ones drain: they finish what they serve and take nothing new). Workers
added through the admin API are not in either config and are left alone.

Also refused: turning authentication on or off (tenants from none to some, or back), a
listed worker's version changing under the same URL, a URL listed twice, and a model left
with fewer listed workers than `daemon.min_ready_workers`. What only the running process
knows (who is ready, draining or added through the admin API) `App.reload` checks before it
applies anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from homing.config.models import ModelSettings
from homing.config.root import HomingConfig

#: Dotted paths a reload applies in place; "*" is every element of a list.
RELOADABLE: tuple[str, ...] = (
    "tenants",
    "admin.keys",
    "slo",
    "gateway.request_timeout_s",
    "gateway.drain_timeout_s",
    "engines.workers",
    "router.policy",
    "router.weights",
    "router.load_factor",
    "router.min_bound",
    "router.hit_load_factor",
    "router.hit_min_bound",
    "router.ring_choices",
    "router.vnodes",
    "router.min_match_ratio",
    "router.max_token_usage",
    "router.max_waiting",
    "router.models",
    "router.max_retries",
    "router.retry_budget_ratio",
    "router.retry_min_per_s",
    "router.retry_window_s",
    "router.migrate_streams",
    "models.*.workers",
    "models.*.policy",
    "models.*.weights",
    "models.*.slo",
)

#: Router settings of retries and stream migration (`homing.gateway.retry_budget`).
_RETRIES = (
    "max_retries",
    "retry_budget_ratio",
    "retry_min_per_s",
    "retry_window_s",
    "migrate_streams",
)

#: Router settings that shape the policy (`homing.router.settings.policy_configs`).
_ROUTING = tuple(
    p.removeprefix("router.")
    for p in RELOADABLE
    if p.startswith("router.") and p.removeprefix("router.") not in _RETRIES
)


@dataclass(frozen=True)
class WorkerChanges:
    """One served model's listed workers: `added` (url, version) and `removed` urls."""

    model_index: int
    added: tuple[tuple[str, str], ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReloadPlan:
    """What changes. `refused`: the paths that need a restart; `rejected`: other reasons the
    new config cannot be served as it is (both empty: the plan applies). `changes`: the
    changed reloadable paths, for the log.

    Filled by `App.reload` once applied (`with_results`): `failed`, the (url, reason) of each
    added worker that did not join (refused by its pool, as at startup); `joining`, the added
    urls not reachable yet (probed until they answer, as at startup); `rejoined`, the urls
    that were draining and serve again."""

    refused: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()
    tenants: bool = False
    admin_keys: bool = False
    routing: bool = False
    slo: bool = False
    timeouts: bool = False
    retries: bool = False
    workers: tuple[WorkerChanges, ...] = field(default_factory=tuple)
    failed: tuple[tuple[str, str], ...] = ()
    joining: tuple[str, ...] = ()
    rejoined: tuple[str, ...] = ()

    @property
    def applies(self) -> bool:
        """True when nothing needs a restart and nothing is rejected."""
        return not self.refused and not self.rejected

    @property
    def empty(self) -> bool:
        """True when nothing differs that the running process serves."""
        return self.applies and not self.changes

    def refusal(self) -> str:
        """Why the plan is refused, in words a person can act on."""
        return refusal(self.refused, self.rejected)

    def with_results(
        self,
        *,
        failed: tuple[tuple[str, str], ...] = (),
        joining: tuple[str, ...] = (),
        rejoined: tuple[str, ...] = (),
    ) -> ReloadPlan:
        """This plan with what applying it did to the added workers."""
        return replace(self, failed=failed, joining=joining, rejoined=rejoined)

    def outcome(self) -> str:
        """One line for the STATUS and the log: "reloaded: <changes>", then the added
        workers that did not join (with why), are not reachable yet, or serve again."""
        parts = [f"reloaded: {', '.join(self.changes) or 'nothing changed'}"]
        if self.failed:
            shown = ", ".join(f"{url} ({why})" for url, why in self.failed)
            parts.append(f"{_count(len(self.failed), 'worker')} did not join: {shown}")
        if self.joining:
            parts.append(f"not reachable yet (joining): {', '.join(self.joining)}")
        if self.rejoined:
            parts.append(f"draining, serving again: {', '.join(self.rejoined)}")
        return "; ".join(parts)


def refusal(refused: tuple[str, ...] = (), rejected: tuple[str, ...] = ()) -> str:
    """A refused reload in words a person can act on: the `refused` paths need a restart,
    each `rejected` reason says what to change; nothing was applied either way."""
    parts = []
    if refused:
        parts.append(
            f"{', '.join(refused)} cannot change without a restart (systemctl restart homing)"
        )
    parts += rejected
    return "; ".join([*parts, "nothing was applied"])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def plan_reload(old: HomingConfig, new: HomingConfig) -> ReloadPlan:
    """The plan that takes a process serving `old` to `new` (see the module docstring)."""
    before = old.model_dump(mode="json")
    after = new.model_dump(mode="json")
    refused = _differences(_without_reloadable(before), _without_reloadable(after))
    # Listed workers replace the fleet homing starts itself: going from none to some (or
    # back) changes what runs, not who is routed to.
    old_models, new_models = old.served_models(), new.served_models()
    if len(old_models) == len(new_models):
        for i, (a, b) in enumerate(zip(old_models, new_models, strict=True)):
            if bool(a.workers) != bool(b.workers):
                refused.append(f"models[{i}].workers (listed <-> started by homing)")
    rejected = _auth_switch(old, new)
    if not refused:
        rejected += _worker_problems(old_models, new_models, new.daemon.min_ready_workers)
    if refused or rejected:
        return ReloadPlan(refused=tuple(refused), rejected=tuple(rejected))
    paths = _flat_paths(RELOADABLE, before, after)
    changes = [p for p in paths if _get(before, p) != _get(after, p)]
    workers = []
    for i, (a, b) in enumerate(zip(old_models, new_models, strict=True)):
        was = dict(a.worker_specs())
        now = dict(b.worker_specs())
        added = tuple((u, v) for u, v in now.items() if u not in was)
        removed = tuple(u for u in was if u not in now)
        if added or removed:
            workers.append(WorkerChanges(i, added, removed))
        elif was == now:  # the same workers in another order: nothing to apply
            worker_path = f"models[{i}].workers" if new.models else "engines.workers"
            changes = [p for p in changes if p != worker_path]
    routing = any(
        old.router.model_dump().get(k) != new.router.model_dump().get(k) for k in _ROUTING
    ) or any(
        (a.policy, a.weights) != (b.policy, b.weights)
        for a, b in zip(old_models, new_models, strict=True)
    )
    return ReloadPlan(
        changes=tuple(changes),
        tenants=before["tenants"] != after["tenants"],
        admin_keys=before["admin"]["keys"] != after["admin"]["keys"],
        routing=routing,
        slo=before["slo"] != after["slo"]
        or any(a.slo != b.slo for a, b in zip(old_models, new_models, strict=True)),
        timeouts=before["gateway"]["request_timeout_s"] != after["gateway"]["request_timeout_s"]
        or before["gateway"]["drain_timeout_s"] != after["gateway"]["drain_timeout_s"],
        retries=any(before["router"][k] != after["router"][k] for k in _RETRIES),
        workers=tuple(workers),
    )


def _auth_switch(old: HomingConfig, new: HomingConfig) -> list[str]:
    """Authentication is on exactly when tenants are configured; a reload keeps it as it is
    (turning it off would let every request in, on would refuse every client without a key)."""
    if old.tenants and not new.tenants:
        return [
            "the new config has no tenants, which would turn authentication off; "
            "that needs a restart (systemctl restart homing)"
        ]
    if new.tenants and not old.tenants:
        return [
            "the new config adds tenants to a gateway serving without authentication, "
            "which would turn it on; that needs a restart (systemctl restart homing)"
        ]
    return []


def _worker_problems(
    old_models: list[ModelSettings], new_models: list[ModelSettings], min_ready: int
) -> list[str]:
    """Listed workers the new config cannot have: a URL listed twice, a version changed
    under the same URL, a model with fewer listed workers than `min_ready`."""
    out = []
    seen: set[str] = set()
    for spec in new_models:
        for url, _ in spec.worker_specs():
            if url in seen:
                out.append(f"worker {url} is listed twice")
            seen.add(url)
    for a, b in zip(old_models, new_models, strict=True):
        was = dict(a.worker_specs())
        now = b.worker_specs()
        for url, version in now:
            if url in was and was[url] != version:
                out.append(
                    f"the version of worker {url} cannot change in place "
                    f"({was[url]!r} -> {version!r}): remove it in one reload and list it "
                    "again once it has drained, or restart"
                )
        if b.workers and dict(now) != was and len(now) < min_ready:
            out.append(
                f"{_model(b)} would list {_count(len(now), 'worker')}, fewer than "
                f"daemon.min_ready_workers ({min_ready})"
            )
    return out


def _model(spec: ModelSettings) -> str:
    """A served model as a message names it."""
    return f"model {spec.name!r}" if spec.name is not None else "the model of engines.workers"


def _without_reloadable(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of the dumped config with every reloadable path removed."""
    out = _copy(data)
    for path in RELOADABLE:
        _remove(out, path.split("."))
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _remove(node: Any, parts: list[str]) -> None:
    head, rest = parts[0], parts[1:]
    if head == "*":
        if isinstance(node, list):
            for item in node:
                _remove(item, rest)
        return
    if not isinstance(node, dict) or head not in node:
        return
    if rest:
        _remove(node[head], rest)
    else:
        del node[head]


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths where `a` and `b` differ (lists of another length differ as a whole)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            path = f"{prefix}.{key}" if prefix else key
            if key not in a or key not in b:
                out.append(path)
            else:
                out += _differences(a[key], b[key], path)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += _differences(x, y, f"{prefix}[{i}]")
        return out
    return [] if a == b else [prefix]


def _flat_paths(paths: tuple[str, ...], a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """`paths` with each "*" expanded over the list elements of `a` (same length as `b`)."""
    out: list[str] = []
    for path in paths:
        head, star, tail = path.partition(".*.")
        if not star:
            out.append(path)
            continue
        count = len(_get(a, head) or [])
        out += [f"{head}[{i}].{tail}" for i in range(count)]
    return out


def _get(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.replace("[", ".").replace("]", "").split("."):
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return None
    return node
