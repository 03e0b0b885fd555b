"""The reload plan is a pure function of two configs (`homing.config.reload_plan`): each kind
of change gives exactly one plan. In place: tenants, admin keys, routing (router-wide and
per model), SLOs, timeouts, retries and listed workers. Refused, applying nothing: any other
setting (it needs a restart, named by its path), and what could not be applied as written:
authentication switched on or off, a worker's version changed under its URL, a URL listed
twice, a model listing fewer workers than it needs ready."""

from __future__ import annotations

from typing import Any

import pytest

from homing.config import HomingConfig
from homing.config.reload_plan import ReloadPlan, WorkerChanges, plan_reload, refusal

SHA = "a" * 64
SHA2 = "b" * 64
W1, W2, W3, W4 = (f"grpc://127.0.0.1:700{i}" for i in range(1, 5))
RESTART = "cannot change without a restart (systemctl restart homing)"
ACME = {"name": "acme", "keys": [{"id": "k1", "sha256": SHA}], "quota": {"requests_per_minute": 60}}


def _config(**extra: Any) -> HomingConfig:
    """One model "m" listing W1 and W2, and tenant "acme"; `extra` replaces whole sections."""
    data: dict[str, Any] = {"models": [{"name": "m", "workers": [W1, W2]}], "tenants": [ACME]}
    data.update(extra)
    return HomingConfig.model_validate(data)


def _listed(*workers: str | dict[str, str], **model: Any) -> list[dict[str, Any]]:
    return [{"name": "m", "workers": list(workers), **model}]


# id -> (the old config's sections, the new config's sections, the plan). The old config is
# `_config(**old)`, the new one `_config(**new)`.
APPLIED: dict[str, tuple[dict[str, Any], dict[str, Any], ReloadPlan]] = {
    "nothing": ({}, {}, ReloadPlan()),
    "a tenant's quota": (
        {},
        {"tenants": [{**ACME, "quota": {"requests_per_minute": 5}}]},
        ReloadPlan(changes=("tenants",), tenants=True),
    ),
    "a second tenant": (
        {},
        {"tenants": [ACME, {"name": "beta", "keys": [{"id": "k2", "sha256": SHA2}]}]},
        ReloadPlan(changes=("tenants",), tenants=True),
    ),
    "the admin keys": (
        {},
        {"admin": {"keys": [{"id": "ops", "sha256": SHA2}]}},
        ReloadPlan(changes=("admin.keys",), admin_keys=True),
    ),
    "the router's policy": (
        {},
        {"router": {"policy": "round_robin"}},
        ReloadPlan(changes=("router.policy",), routing=True),
    ),
    "the router's weights": (
        {},
        {"router": {"weights": {"prefill": 2.0}}},
        ReloadPlan(changes=("router.weights",), routing=True),
    ),
    "the router's bounds": (
        {},
        {"router": {"load_factor": 2.0, "min_bound": 2, "max_waiting": 8}},
        ReloadPlan(
            changes=("router.load_factor", "router.min_bound", "router.max_waiting"),
            routing=True,
        ),
    ),
    "a per-model override in router.models": (
        {},
        {"router": {"models": {"m": {"policy": "least_load"}}}},
        ReloadPlan(changes=("router.models",), routing=True),
    ),
    "a model's own policy": (
        {},
        {"models": _listed(W1, W2, policy="least_load")},
        ReloadPlan(changes=("models[0].policy",), routing=True),
    ),
    "a model's own weights": (
        {},
        {"models": _listed(W1, W2, weights={"decode": 64.0})},
        ReloadPlan(changes=("models[0].weights",), routing=True),
    ),
    "the SLO": (
        {},
        {"slo": {"ttft_p95_s": 0.2}},
        ReloadPlan(changes=("slo",), slo=True),
    ),
    "a model's own SLO": (
        {},
        {"models": _listed(W1, W2, slo={"tpot_p95_s": 0.1})},
        ReloadPlan(changes=("models[0].slo",), slo=True),
    ),
    "the request timeout": (
        {},
        {"gateway": {"request_timeout_s": 30.0}},
        ReloadPlan(changes=("gateway.request_timeout_s",), timeouts=True),
    ),
    "the drain timeout": (
        {},
        {"gateway": {"drain_timeout_s": 5.0}},
        ReloadPlan(changes=("gateway.drain_timeout_s",), timeouts=True),
    ),
    "retries": (
        {},
        {"router": {"max_retries": 0, "retry_budget_ratio": 0.5}},
        ReloadPlan(changes=("router.max_retries", "router.retry_budget_ratio"), retries=True),
    ),
    "stream migration": (
        {},
        {"router": {"migrate_streams": True}},
        ReloadPlan(changes=("router.migrate_streams",), retries=True),
    ),
    "a removed worker": (
        {},
        {"models": _listed(W1)},
        ReloadPlan(changes=("models[0].workers",), workers=(WorkerChanges(0, (), (W2,)),)),
    ),
    "an added worker with its version": (
        {},
        {"models": _listed(W1, W2, {"url": W3, "version": "v2"})},
        ReloadPlan(changes=("models[0].workers",), workers=(WorkerChanges(0, ((W3, "v2"),), ()),)),
    ),
    "a worker replaced by another": (
        {},
        {"models": _listed(W1, W3)},
        ReloadPlan(changes=("models[0].workers",), workers=(WorkerChanges(0, ((W3, ""),), (W2,)),)),
    ),
    "the same workers in another order": ({}, {"models": _listed(W2, W1)}, ReloadPlan()),
    "engines.workers, the model of a file with no [[models]]": (
        {"models": [], "engines": {"workers": [W1]}},
        {"models": [], "engines": {"workers": [W1, W2]}},
        ReloadPlan(changes=("engines.workers",), workers=(WorkerChanges(0, ((W2, ""),), ()),)),
    ),
    "several at once, named in RELOADABLE's order": (
        {},
        {
            "tenants": [{**ACME, "quota": {"requests_per_minute": 5}}],
            "slo": {"objective": 0.99},
            "gateway": {"drain_timeout_s": 5.0},
            "router": {"vnodes": 80, "retry_window_s": 20.0},
            "models": _listed(W1, W2, W3, policy="round_robin"),
        },
        ReloadPlan(
            changes=(
                "tenants",
                "slo",
                "gateway.drain_timeout_s",
                "router.vnodes",
                "router.retry_window_s",
                "models[0].workers",
                "models[0].policy",
            ),
            tenants=True,
            routing=True,
            slo=True,
            timeouts=True,
            retries=True,
            workers=(WorkerChanges(0, ((W3, ""),), ()),),
        ),
    ),
}


@pytest.mark.parametrize(("old", "new", "plan"), APPLIED.values(), ids=APPLIED.keys())
def test_a_change_that_applies_in_place_gives_its_plan(
    old: dict[str, Any], new: dict[str, Any], plan: ReloadPlan
) -> None:
    got = plan_reload(_config(**old), _config(**new))
    assert got == plan
    assert got.applies and got.empty == (plan.changes == ())


# id -> (old sections, new sections, the refused paths, the other reasons, refusal()).
REFUSED: dict[str, tuple[dict[str, Any], dict[str, Any], tuple[str, ...], tuple[str, ...], str]] = {
    "the HTTP port": (
        {},
        {"gateway": {"port": 9999}},
        ("gateway.port",),
        (),
        f"gateway.port {RESTART}; nothing was applied",
    ),
    "a limit of the listeners": (
        {},
        {"gateway": {"max_body_bytes": 1024, "grpc_port": 50052}},
        ("gateway.grpc_port", "gateway.max_body_bytes"),
        (),
        f"gateway.grpc_port, gateway.max_body_bytes {RESTART}; nothing was applied",
    ),
    "the quota store, the block size and the policy together": (
        {},
        {"quotas": {"backend": "redis"}, "router": {"block_size": 32, "policy": "round_robin"}},
        ("quotas.backend", "router.block_size"),
        (),
        f"quotas.backend, router.block_size {RESTART}; nothing was applied",
    ),
    "the admission queue": (
        {},
        {"admission": {"max_queued": 8}},
        ("admission.max_queued",),
        (),
        f"admission.max_queued {RESTART}; nothing was applied",
    ),
    "the daemon's settings": (
        {},
        {"daemon": {"min_ready_workers": 2}},
        ("daemon.min_ready_workers",),
        (),
        f"daemon.min_ready_workers {RESTART}; nothing was applied",
    ),
    "a second served model": (
        {},
        {"models": [*_listed(W1, W2), {"name": "n", "workers": [W3]}]},
        ("models",),
        (),
        f"models {RESTART}; nothing was applied",
    ),
    "a served model's name": (
        {},
        {"models": [{"name": "other", "workers": [W1, W2]}]},
        ("models[0].name",),
        (),
        f"models[0].name {RESTART}; nothing was applied",
    ),
    "a served model's version": (
        {},
        {"models": _listed(W1, W2, version="v2")},
        ("models[0].version",),
        (),
        f"models[0].version {RESTART}; nothing was applied",
    ),
    "listed workers to workers homing starts": (
        {"tenants": []},
        {"tenants": [], "models": [{"name": "m"}]},
        ("models[0].workers (listed <-> started by homing)",),
        (),
        f"models[0].workers (listed <-> started by homing) {RESTART}; nothing was applied",
    ),
    "dropping every tenant (authentication off)": (
        {},
        {"tenants": []},
        (),
        (
            "the new config has no tenants, which would turn authentication off; that needs "
            "a restart (systemctl restart homing)",
        ),
        "the new config has no tenants, which would turn authentication off; that needs a "
        "restart (systemctl restart homing); nothing was applied",
    ),
    "the first tenants (authentication on)": (
        {"tenants": []},
        {},
        (),
        (
            "the new config adds tenants to a gateway serving without authentication, which "
            "would turn it on; that needs a restart (systemctl restart homing)",
        ),
        "the new config adds tenants to a gateway serving without authentication, which "
        "would turn it on; that needs a restart (systemctl restart homing); nothing was "
        "applied",
    ),
    "a listed worker's version": (
        {"models": _listed(W1, {"url": W2})},
        {"models": _listed(W1, {"url": W2, "version": "v2"})},
        (),
        (
            f"the version of worker {W2} cannot change in place ('' -> 'v2'): remove it in "
            "one reload and list it again once it has drained, or restart",
        ),
        f"the version of worker {W2} cannot change in place ('' -> 'v2'): remove it in one "
        "reload and list it again once it has drained, or restart; nothing was applied",
    ),
    "a URL listed twice in engines.workers": (
        {"models": [], "engines": {"workers": [W1]}},
        {"models": [], "engines": {"workers": [W1, "grpc://localhost:7001"]}},
        (),
        (f"worker {W1} is listed twice",),
        f"worker {W1} is listed twice; nothing was applied",
    ),
    "fewer listed workers than daemon.min_ready_workers": (
        {"daemon": {"min_ready_workers": 2}},
        {"daemon": {"min_ready_workers": 2}, "models": _listed(W1)},
        (),
        ("model 'm' would list 1 worker, fewer than daemon.min_ready_workers (2)",),
        "model 'm' would list 1 worker, fewer than daemon.min_ready_workers (2); "
        "nothing was applied",
    ),
    "the workers of engines.workers below daemon.min_ready_workers": (
        {"models": [], "engines": {"workers": [W1, W2, W3]}, "daemon": {"min_ready_workers": 3}},
        {"models": [], "engines": {"workers": [W1, W4]}, "daemon": {"min_ready_workers": 3}},
        (),
        (
            "the model of engines.workers would list 2 workers, fewer than "
            "daemon.min_ready_workers (3)",
        ),
        "the model of engines.workers would list 2 workers, fewer than "
        "daemon.min_ready_workers (3); nothing was applied",
    ),
    "restart paths and other reasons together": (
        {},
        {"gateway": {"port": 9999}, "tenants": []},
        ("gateway.port",),
        (
            "the new config has no tenants, which would turn authentication off; that needs "
            "a restart (systemctl restart homing)",
        ),
        f"gateway.port {RESTART}; the new config has no tenants, which would turn "
        "authentication off; that needs a restart (systemctl restart homing); nothing was "
        "applied",
    ),
}


@pytest.mark.parametrize(
    ("old", "new", "refused", "rejected", "message"), REFUSED.values(), ids=REFUSED.keys()
)
def test_a_change_that_cannot_apply_is_refused_whole_with_its_reason(
    old: dict[str, Any],
    new: dict[str, Any],
    refused: tuple[str, ...],
    rejected: tuple[str, ...],
    message: str,
) -> None:
    """Nothing of a refused plan is marked to apply: no flag, no change, no worker."""
    plan = plan_reload(_config(**old), _config(**new))
    assert plan == ReloadPlan(refused=refused, rejected=rejected)
    assert not plan.applies and not plan.empty
    assert plan.refusal() == message


def test_unchanged_workers_are_not_judged_again() -> None:
    """A model already listing fewer workers than it needs ready does not block a reload
    that leaves its workers as they are."""
    daemon = {"min_ready_workers": 2}
    old = _config(daemon=daemon, models=_listed(W1))
    new = _config(daemon=daemon, models=_listed(W1), slo={"objective": 0.9})
    assert plan_reload(old, new) == ReloadPlan(changes=("slo",), slo=True)


def test_workers_are_judged_only_when_nothing_needs_a_restart() -> None:
    """With a path that needs a restart, a worker problem is not reported as well (the
    restart is the first thing to fix); the authentication switch still is (above)."""
    old = _config(models=[], engines={"workers": [W1]})
    twice = {"workers": [W1, "grpc://localhost:7001"]}
    new = _config(models=[], engines=twice, gateway={"port": 9999})
    assert plan_reload(old, new) == ReloadPlan(refused=("gateway.port",))
    alone = _config(models=[], engines=twice)
    assert plan_reload(old, alone).rejected == (f"worker {W1} is listed twice",)


@pytest.mark.parametrize(
    ("refused", "rejected", "message"),
    [
        ((), (), "nothing was applied"),
        (("a", "b"), (), f"a, b {RESTART}; nothing was applied"),
        ((), ("x", "y"), "x; y; nothing was applied"),
        (("a",), ("x",), f"a {RESTART}; x; nothing was applied"),
    ],
)
def test_the_refusal_names_restart_paths_then_reasons(
    refused: tuple[str, ...], rejected: tuple[str, ...], message: str
) -> None:
    assert refusal(refused, rejected) == message


# id -> (failed, joining, rejoined, the outcome line of a plan that changed the workers).
OUTCOMES: dict[str, tuple[Any, Any, Any, str]] = {
    "all joined": ((), (), (), "reloaded: models[0].workers"),
    "one did not join": (
        ((W3, "refused: it serves model 'other'"),),
        (),
        (),
        f"reloaded: models[0].workers; 1 worker did not join: {W3} "
        "(refused: it serves model 'other')",
    ),
    "two did not join": (
        ((W3, "x"), (W4, "y")),
        (),
        (),
        f"reloaded: models[0].workers; 2 workers did not join: {W3} (x), {W4} (y)",
    ),
    "each kind": (
        ((W3, "refused: it serves model 'other'"),),
        (W4,),
        ("grpc://127.0.0.1:7009",),
        f"reloaded: models[0].workers; 1 worker did not join: {W3} "
        f"(refused: it serves model 'other'); not reachable yet (joining): {W4}; "
        "draining, serving again: grpc://127.0.0.1:7009",
    ),
}


@pytest.mark.parametrize(
    ("failed", "joining", "rejoined", "line"), OUTCOMES.values(), ids=OUTCOMES.keys()
)
def test_the_outcome_names_what_became_of_the_added_workers(
    failed: tuple[tuple[str, str], ...],
    joining: tuple[str, ...],
    rejoined: tuple[str, ...],
    line: str,
) -> None:
    plan = plan_reload(_config(), _config(models=_listed(W1, W3, W4)))
    done = plan.with_results(failed=failed, joining=joining, rejoined=rejoined)
    assert done.outcome() == line
    assert (done.changes, done.workers) == (plan.changes, plan.workers)


def test_an_empty_plan_says_nothing_changed() -> None:
    assert plan_reload(_config(), _config()).outcome() == "reloaded: nothing changed"


def test_planning_reads_only_its_arguments() -> None:
    """The same two configs always give the same plan, and neither config is changed."""
    old, new = _config(), _config(models=_listed(W1, W3), router={"policy": "round_robin"})
    before = (old.model_dump(), new.model_dump())
    assert plan_reload(old, new) == plan_reload(old, new)
    assert (old.model_dump(), new.model_dump()) == before
