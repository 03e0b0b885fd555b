"""What a configuration reload changes: the pure difference of two validated configs.

Rule of the file: no I/O. `plan_reload(old, new)` says what the running process must do to
serve `new`, or why it cannot without a restart. A reload is all or nothing: when any
setting outside `RELOADABLE` differs (listeners, the quota store, the engines homing starts,
the served models, the index's block size, ...), the plan is refused and nothing is applied.

Reloadable in place: tenants and their keys and quotas, the admin keys, the routing policy
and its weights and bounds (router-wide and per model), retries and stream migration, the
SLOs, the request and drain timeouts, and the listed workers of each served model (added
ones join, removed ones drain: they finish what they serve and take nothing new). Workers
added through the admin API are not in either config and are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from homing.config import HomingConfig

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
    """What changes. `refused`: the paths that need a restart (empty: the plan applies).
    `changes`: the changed reloadable paths, for the log."""

    refused: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()
    tenants: bool = False
    admin_keys: bool = False
    routing: bool = False
    slo: bool = False
    timeouts: bool = False
    retries: bool = False
    workers: tuple[WorkerChanges, ...] = field(default_factory=tuple)

    @property
    def applies(self) -> bool:
        """True when nothing needs a restart."""
        return not self.refused

    @property
    def empty(self) -> bool:
        """True when the configs are the same."""
        return not self.refused and not self.changes

    def refusal(self) -> str:
        """Why the plan is refused, in words a person can act on."""
        return (
            f"{', '.join(self.refused)} cannot change without a restart "
            "(systemctl restart homing); nothing was applied"
        )


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
    if refused:
        return ReloadPlan(refused=tuple(refused))
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
