"""`[[models]] versions` and `[rollout]`: a split no worker can serve and a plan that cannot
run are refused when the config is read, with the file and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.config import ConfigError, load_config


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


def test_a_split_and_rollout_defaults_load(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        '[[models]]\nname = "m"\nversion = "v1"\nversions = { v1 = 95, v2 = 5 }\n'
        '[rollout]\nsteps = [10, 100]\nbake_s = 60\non_rollback = "keep"\n',
    )
    model = config.models[0]  # type: ignore[attr-defined]
    assert model.versions == {"v1": 95.0, "v2": 5.0}
    rollout = config.rollout  # type: ignore[attr-defined]
    assert (rollout.steps, rollout.bake_s, rollout.on_rollback) == ([10.0, 100.0], 60.0, "keep")


def test_a_split_that_weights_no_version_the_workers_carry_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, '[[models]]\nname = "m"\nversions = { v1 = 100 }\n')
    assert "versions gives weight to 'v1' but the model's workers carry '': no request could" in (
        str(err.value)
    )


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ("{ v1 = 0 }", "at least one version needs a weight above 0"),
        ("{ v1 = -1 }", "the weight of version 'v1' must be 0 or in [1e-06, 1e+06], got -1.0"),
        ('{ "" = 1 }', "a version label must be 1 to 128 printable ASCII characters, got ''"),
    ],
)
def test_a_malformed_split_is_refused(tmp_path: Path, versions: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f'[[models]]\nname = "m"\nversion = "v1"\nversions = {versions}\n')
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("[100]", "a rollout needs a step below 100"),
        ("[50, 25, 100]", "the steps must increase (e.g. 5,25,50,100)"),
        ("[5, 50]", "the last step must be 100 (it promotes the canary), got 50"),
    ],
)
def test_rollout_steps_that_cannot_run_are_refused(
    tmp_path: Path, steps: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f"[rollout]\nsteps = {steps}\n")
    assert message in str(err.value)
