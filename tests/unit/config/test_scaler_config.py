"""`[scaler]` and `[[models]] scaler`: off by default, the policy's config and seeds they
make, and every inconsistent or ill-typed setting refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.config import ConfigError, SimSettings, gpus_per_replica, load_config
from homing.obs.slo import Slo
from homing.scaler.policy import ScalerConfig
from homing.scaler.settings import (
    FALLBACK_DECODE_STREAMS,
    scaler_config,
    seed_capacity,
)


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def test_the_scaler_is_off_by_default_and_its_defaults_are_the_policys() -> None:
    cfg = load_config(None)
    s = cfg.scaler_of(cfg.served_models()[0])
    assert s.enabled is False and s.mode == "active" and s.actuator == "local"
    assert scaler_config(s, gpus=1) == ScalerConfig()


def test_a_models_own_scaler_replaces_the_top_level_one(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        '[scaler]\nenabled = true\nmax_replicas = 4\n\n[[models]]\nname = "a"\n\n'
        '[[models]]\nname = "b"\n[models.scaler]\nenabled = true\nmode = "advisory"\n'
        "max_replicas = 2\n",
    )
    a, b = cfg.served_models()
    assert (cfg.scaler_of(a).max_replicas, cfg.scaler_of(a).mode) == (4, "active")
    assert (cfg.scaler_of(b).max_replicas, cfg.scaler_of(b).mode) == (2, "advisory")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[scaler]\nmin_replicas = 3\nmax_replicas = 2\n", "min_replicas must not exceed"),
        ("[scaler]\nmin_replicas = 0\n", "min_replicas = 0 needs scale_to_zero"),
        ('[scaler]\nactuator = "exec"\n', r"needs a \[scaler.exec\] command"),
        ('[scaler]\nactuator = "kubernetes"\n', r"needs a \[scaler.kubernetes\] table"),
        ('[scaler]\ncommand = ["x", "{prt}"]\n', "unknown placeholder {prt}"),
        ("[scaler]\ncommand = []\n", "scaler.command"),
        ('[scaler]\ncommand = ["x", "{port:zz}"]\n', "cannot be filled in: Unknown format code"),
        ('[scaler]\ncommand = ["x", "{port!z}"]\n', "cannot be filled in: Unknown conversion"),
        ('[scaler]\nactuator = "exec"\n[scaler.exec]\ncommand = [""]\n', "scaler.exec.command"),
        ('[scaler]\nhysteresis = "0.1"\n', "scaler.hysteresis"),
        ("[scaler]\nmax_replicas = 0\n", "scaler.max_replicas"),
        ("[scaler]\ntick_s = 0\n", "scaler.tick_s"),
        (
            "[scaler]\ntick_s = 1e-300\n",
            "scaler.tick_s: Input should be greater than or equal to 0.1",
        ),
        ("[scaler]\ntick_s = 1e300\n", "scaler.tick_s: Input should be less than or equal to 3600"),
        ("[scaler]\nleader_lease_s = 1e-9\n", "scaler.leader_lease_s: Input should be greater"),
        (
            '[scaler]\nactuator = "exec"\n[scaler.exec]\ncommand = ["x"]\npoll_s = 0.001\n',
            "scaler.exec.poll_s: Input should be greater than or equal to 0.1",
        ),
        (
            '[scaler]\n[scaler.exec]\ncommand = ["x"]\n',
            r'\[scaler.exec\] is the "exec" actuator\'s table, but scaler.actuator is "local"',
        ),
        (
            '[scaler]\nactuator = "exec"\n[scaler.exec]\ncommand = ["x"]\n'
            '[scaler.kubernetes]\nname = "w"\nselector = "app=w"\n',
            r'\[scaler.kubernetes\] is the "kubernetes" actuator\'s and Lease elector\'s table, '
            r'but scaler.actuator is "exec" and leader "single"',
        ),
        (
            '[scaler]\nactuator = "kubernetes"\n[scaler.kubernetes]\nname = "w"\n'
            'selector = "app=w"\nnamespace = "Not A Namespace!"\n',
            "scaler.kubernetes.namespace: String should match pattern",
        ),
        (
            '[scaler]\nactuator = "kubernetes"\n[scaler.kubernetes]\nname = "W_1"\n'
            'selector = "app=w"\n',
            "scaler.kubernetes.name: String should match pattern",
        ),
        (
            "[scaler]\nmax_replicas = 2\nwarm_replicas = 2\n",
            r"scaler.warm_replicas \(2\) must not exceed max_replicas - min_replicas \(1\)",
        ),
        ("[scaler]\ndecode_streams_per_replica = nan\n", "scaler.decode_streams_per_replica"),
        ('[scaler]\nmode = "dry"\n', "scaler.mode"),
        ("[scaler]\nwarm = 1\n", "scaler.warm"),
        (
            '[scaler]\nenabled = true\n[engines]\nworkers = ["grpc://127.0.0.1:5"]\n',
            'actuator = "local" starts the model\'s own workers',
        ),
        (
            '[[models]]\nname = "a"\n[models.scaler]\ngpu_budget = 8\n',
            r"set it in \[scaler\]",
        ),
        (
            "[scaler]\nenabled = true\nscale_to_zero = true\nmin_replicas = 0\n"
            "[admission]\nmax_queued = 0\n",
            "scale_to_zero holds requests in the admission queue",
        ),
    ],
)
def test_a_bad_scaler_setting_is_refused_with_its_reason(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, text)


def test_the_kubernetes_table_gives_the_lease_elector_its_kubeconfig_beside_another_actuator(
    tmp_path: Path,
) -> None:
    config = _load(
        tmp_path,
        '[scaler]\nactuator = "exec"\nleader = "kubernetes"\n[scaler.exec]\ncommand = ["x"]\n'
        '[scaler.kubernetes]\nname = "w"\nselector = "app=w"\nkubeconfig = "/etc/k"\n',
    )
    assert config.scaler.kubernetes is not None
    assert config.scaler.kubernetes.kubeconfig == "/etc/k"


def test_a_gpu_budget_below_the_pools_minimum_is_refused_in_one_line(tmp_path: Path) -> None:
    """2 replicas of 8 GPUs at the least cannot fit a budget of 1 GPU; a rule across
    sections is shown without an empty location or pydantic's prefix."""
    text = (
        "[scaler]\nenabled = true\nmin_replicas = 2\nmax_replicas = 2\n"
        "gpus_per_replica = 8\ngpu_budget = 1\n"
    )
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    assert str(caught.value).endswith(
        ".toml: scaler.gpu_budget (1 GPUs) is below what the autoscaled pools' "
        "min_replicas x gpus_per_replica hold (16 GPUs)"
    )
    _load(tmp_path, text.replace("gpu_budget = 1", "gpu_budget = 16"))


def test_seeds_come_from_the_config_then_the_timing_model_then_the_fallback(
    tmp_path: Path,
) -> None:
    cfg = _load(tmp_path, "[scaler]\ndecode_streams_per_replica = 12.0\n")
    slo = Slo()
    sim = SimSettings(model="llama-3.1-8b", speedup=1.0)
    decode, prefill, source = seed_capacity(cfg.scaler, sim, slo)
    assert decode == 12.0 and prefill > 1000 and source == "timing model"
    fast_decode, fast_prefill, _ = seed_capacity(
        load_config(None).scaler, SimSettings(model="llama-3.1-8b", speedup=10.0), slo
    )
    slow_decode, slow_prefill, _ = seed_capacity(load_config(None).scaler, sim, slo)
    assert fast_decode > slow_decode and fast_prefill == pytest.approx(10 * slow_prefill)
    assert seed_capacity(load_config(None).scaler, None, slo)[0] == FALLBACK_DECODE_STREAMS
    assert seed_capacity(load_config(None).scaler, None, slo)[2] == "fallback"


def test_gpus_per_replica_is_the_sim_presets_tp_unless_set(tmp_path: Path) -> None:
    s = load_config(None).scaler
    assert gpus_per_replica(s, SimSettings(model="llama-3.1-70b")) == 8
    assert gpus_per_replica(s, SimSettings(model="llama-3.1-8b")) == 1
    assert gpus_per_replica(s, None) == 1
    assert gpus_per_replica(_load(tmp_path, "[scaler]\ngpus_per_replica = 4\n").scaler, None) == 4
