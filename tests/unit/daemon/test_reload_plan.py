"""A reload applies tenants, keys, quotas, admin keys, routing, SLOs, timeouts and listed
workers in place, and refuses (applying nothing) anything that needs a restart or that it
could not apply as written: authentication switched on or off, a worker's version changed
under its URL, a URL listed twice, a model listing fewer workers than it needs ready."""

from __future__ import annotations

from typing import Any

from homing.config import HomingConfig
from homing.daemon.reload import plan_reload

SHA = "a" * 64
SHA2 = "b" * 64


def _config(**extra: Any) -> HomingConfig:
    data: dict[str, Any] = {
        "models": [
            {"name": "m", "workers": ["grpc://127.0.0.1:7001", "grpc://127.0.0.1:7002"]},
        ],
        "tenants": [
            {
                "name": "acme",
                "keys": [{"id": "k1", "sha256": SHA}],
                "quota": {"requests_per_minute": 60},
            }
        ],
    }
    data.update(extra)
    return HomingConfig.model_validate(data)


def test_the_same_config_is_an_empty_plan() -> None:
    plan = plan_reload(_config(), _config())
    assert plan.applies and plan.empty


def test_tenants_a_quota_the_policy_and_a_removed_worker_apply_in_place() -> None:
    new = _config(
        tenants=[
            {
                "name": "acme",
                "keys": [{"id": "k1", "sha256": SHA}],
                "quota": {"requests_per_minute": 5},
            },
            {"name": "beta", "keys": [{"id": "k2", "sha256": SHA2}]},
        ],
        router={"policy": "round_robin"},
        models=[{"name": "m", "workers": ["grpc://127.0.0.1:7001"]}],
    )
    plan = plan_reload(_config(), new)
    assert plan.applies
    assert plan.tenants and plan.routing and not plan.slo and not plan.admin_keys
    assert [(w.model_index, w.added, w.removed) for w in plan.workers] == [
        (0, (), ("grpc://127.0.0.1:7002",))
    ]
    assert set(plan.changes) == {"tenants", "router.policy", "models[0].workers"}


def test_an_added_worker_carries_its_version() -> None:
    new = _config(
        models=[
            {
                "name": "m",
                "workers": [
                    "grpc://127.0.0.1:7001",
                    "grpc://127.0.0.1:7002",
                    {"url": "grpc://127.0.0.1:7003", "version": "v2"},
                ],
            }
        ]
    )
    (change,) = plan_reload(_config(), new).workers
    assert change.added == (("grpc://127.0.0.1:7003", "v2"),) and change.removed == ()


def test_slos_admin_keys_weights_and_timeouts_apply_in_place() -> None:
    new = _config(
        slo={"ttft_p95_s": 0.2},
        admin={"keys": [{"id": "ops", "sha256": SHA2}]},
        router={"weights": {"prefill": 2.0}},
        gateway={"request_timeout_s": 30.0},
    )
    plan = plan_reload(_config(), new)
    assert plan.applies and plan.slo and plan.admin_keys and plan.routing and plan.timeouts


def test_a_model_level_policy_change_is_routing() -> None:
    new = _config(models=[{"name": "m", "policy": "least_load", "workers": _workers()}])
    plan = plan_reload(_config(), new)
    assert plan.applies and plan.routing and plan.changes == ("models[0].policy",)


def _workers() -> list[str]:
    return ["grpc://127.0.0.1:7001", "grpc://127.0.0.1:7002"]


def test_listener_store_and_block_size_changes_are_refused_by_name() -> None:
    new = _config(
        gateway={"port": 9999},
        quotas={"backend": "redis"},
        router={"block_size": 32, "policy": "round_robin"},
    )
    plan = plan_reload(_config(), new)
    assert not plan.applies
    assert plan.refused == ("gateway.port", "quotas.backend", "router.block_size")
    assert not plan.routing  # nothing of a refused plan is applied
    assert "gateway.port, quotas.backend, router.block_size cannot change" in plan.refusal()
    assert "nothing was applied" in plan.refusal()


def test_adding_or_renaming_a_served_model_needs_a_restart() -> None:
    two = _config(
        models=[
            {"name": "m", "workers": _workers()},
            {"name": "n", "workers": ["grpc://127.0.0.1:7009"]},
        ]
    )
    assert plan_reload(_config(), two).refused == ("models",)
    renamed = _config(models=[{"name": "other", "workers": _workers()}])
    assert plan_reload(_config(), renamed).refused == ("models[0].name",)


def test_going_from_listed_workers_to_homings_own_needs_a_restart() -> None:
    own = HomingConfig.model_validate({"models": [{"name": "m"}]})
    plan = plan_reload(_config(tenants=[]), own)
    assert not plan.applies
    assert "models[0].workers (listed <-> started by homing)" in plan.refused


def _listed(*workers: str | dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": "m", "workers": list(workers)}]


def test_a_listed_workers_version_change_is_refused_not_reported_as_applied() -> None:
    old = _config(models=_listed("grpc://127.0.0.1:7001", {"url": "grpc://127.0.0.1:7002"}))
    new = _config(
        models=_listed("grpc://127.0.0.1:7001", {"url": "grpc://127.0.0.1:7002", "version": "v2"})
    )
    plan = plan_reload(old, new)
    assert not plan.applies and plan.changes == () and plan.workers == ()
    assert plan.refusal() == (
        "the version of worker grpc://127.0.0.1:7002 cannot change in place ('' -> 'v2'): "
        "remove it in one reload and list it again once it has drained, or restart; "
        "nothing was applied"
    )


def test_workers_listed_in_another_order_change_nothing() -> None:
    new = _config(models=_listed("grpc://127.0.0.1:7002", "grpc://127.0.0.1:7001"))
    plan = plan_reload(_config(), new)
    assert plan.applies and plan.empty and plan.workers == ()


def test_a_url_listed_twice_in_engines_workers_is_refused() -> None:
    old = HomingConfig.model_validate({"engines": {"workers": ["grpc://127.0.0.1:7001"]}})
    new = HomingConfig.model_validate(
        {"engines": {"workers": ["grpc://127.0.0.1:7001", "grpc://localhost:7001"]}}
    )
    assert plan_reload(old, new).refusal() == (
        "worker grpc://127.0.0.1:7001 is listed twice; nothing was applied"
    )


def test_dropping_every_tenant_is_refused_as_it_would_turn_authentication_off() -> None:
    plan = plan_reload(_config(), _config(tenants=[]))
    assert not plan.applies and not plan.tenants
    assert plan.refusal() == (
        "the new config has no tenants, which would turn authentication off; that needs a "
        "restart (systemctl restart homing); nothing was applied"
    )


def test_the_first_tenants_are_refused_as_they_would_turn_authentication_on() -> None:
    new = _config()
    plan = plan_reload(_config(tenants=[]), new)
    assert not plan.applies
    assert plan.refusal() == (
        "the new config adds tenants to a gateway serving without authentication, which "
        "would turn it on; that needs a restart (systemctl restart homing); nothing was "
        "applied"
    )


def test_a_model_listing_fewer_workers_than_min_ready_workers_is_refused_by_name() -> None:
    daemon = {"min_ready_workers": 2}
    new = _config(daemon=daemon, models=_listed("grpc://127.0.0.1:7001"))
    plan = plan_reload(_config(daemon=daemon), new)
    assert not plan.applies and plan.workers == ()
    assert plan.refusal() == (
        "model 'm' would list 1 worker, fewer than daemon.min_ready_workers (2); "
        "nothing was applied"
    )
    # Unchanged workers are not judged again: a tenant change still applies.
    same = _config(daemon=daemon, tenants=[{"name": "z", "keys": [{"id": "k", "sha256": SHA}]}])
    assert plan_reload(_config(daemon=daemon), same).applies


def test_restart_paths_and_other_reasons_are_given_together() -> None:
    new = _config(gateway={"port": 9999}, tenants=[])
    assert plan_reload(_config(), new).refusal() == (
        "gateway.port cannot change without a restart (systemctl restart homing); the new "
        "config has no tenants, which would turn authentication off; that needs a restart "
        "(systemctl restart homing); nothing was applied"
    )


def test_the_outcome_names_workers_that_did_not_join_joining_and_back_from_draining() -> None:
    new = _config(
        models=_listed("grpc://127.0.0.1:7001", "grpc://127.0.0.1:7003", "grpc://127.0.0.1:7004")
    )
    plan = plan_reload(_config(), new)
    assert plan.outcome() == "reloaded: models[0].workers"
    done = plan.with_results(
        failed=(("grpc://127.0.0.1:7003", "refused: it serves model 'other'"),),
        joining=("grpc://127.0.0.1:7004",),
        rejoined=("grpc://127.0.0.1:7009",),
    )
    assert done.outcome() == (
        "reloaded: models[0].workers; 1 worker did not join: grpc://127.0.0.1:7003 "
        "(refused: it serves model 'other'); not reachable yet (joining): "
        "grpc://127.0.0.1:7004; draining, serving again: grpc://127.0.0.1:7009"
    )
