"""The rollout series: what a new rollout, an ended one and a changed split leave behind."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from homing.rollout.metrics import RolloutMetrics


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_rollout_of_another_canary_removes_the_earlier_canarys_phase_series() -> None:
    registry = CollectorRegistry()
    m = RolloutMetrics(registry)
    m.set_phase("m", "v2", "promoted", 100.0)
    m.set_phase("m", "v3", "running", 5.0)
    assert (
        _value(registry, "homing_rollout_phase", model="m", canary="v2", phase="promoted") is None
    )
    assert _value(registry, "homing_rollout_canary_weight", model="m", canary="v2") is None
    assert _value(registry, "homing_rollout_phase", model="m", canary="v3", phase="running") == 1.0
    assert _value(registry, "homing_rollout_canary_weight", model="m", canary="v3") == 5.0


def test_clear_figures_removes_only_that_models_comparison_figures() -> None:
    registry = CollectorRegistry()
    m = RolloutMetrics(registry)
    m.set_figure("attainment", "m", "v1", 0.99)
    m.set_figure("tpot_p50_seconds", "m", "v2", 0.02)
    m.set_figure("attainment", "other", "v1", 0.5)
    m.clear_figures("m")
    assert _value(registry, "homing_rollout_version_attainment", model="m", version="v1") is None
    name = "homing_rollout_version_tpot_p50_seconds"
    assert _value(registry, name, model="m", version="v2") is None
    assert _value(registry, "homing_rollout_version_attainment", model="other", version="v1") == 0.5


def test_a_split_without_a_version_removes_its_weight_series() -> None:
    registry = CollectorRegistry()
    m = RolloutMetrics(registry)
    exported = m.set_split("m", {"v1": 0.95, "v2": 0.05}, set())
    assert _value(registry, "homing_version_weight", model="m", version="v2") == 5.0
    m.set_split("m", {"v1": 1.0}, exported)
    assert _value(registry, "homing_version_weight", model="m", version="v2") is None
    assert _value(registry, "homing_version_weight", model="m", version="v1") == 100.0
