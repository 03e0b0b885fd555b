"""Config files: defaults are the embedded ones; mistakes are reported, never ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from homing.config import ConfigError, HomingConfig, ModelSettings, load_config
from homing.fleet.stream_interval import DEFAULT_MAX_INTERVAL

REPO = Path(__file__).resolve().parents[3]


def test_no_file_gives_the_embedded_default() -> None:
    """Without a file: two simulated workers, gateway on 127.0.0.1:8080 and :50051."""
    config = load_config(None)
    assert config.embedded
    assert config.sim.workers == 2
    assert (config.gateway.host, config.gateway.port, config.gateway.grpc_port) == (
        "127.0.0.1",
        8080,
        50051,
    )
    assert config.router.policy == "cache_aware"


def test_example_config_loads_and_lists_real_workers() -> None:
    """deploy/homing.toml validates and serves the workers it lists."""
    config = load_config(REPO / "deploy" / "homing.toml")
    assert not config.embedded
    assert config.engines.workers == ["grpc://127.0.0.1:30000", "grpc://127.0.0.1:30001"]


def test_unknown_key_is_an_error_naming_it(tmp_path: Path) -> None:
    """A typo in a section is reported with its location."""
    path = tmp_path / "c.toml"
    path.write_text("[gateway]\nprot = 9000\n")
    with pytest.raises(
        ConfigError, match=r"c\.toml: gateway\.prot: Extra inputs are not permitted"
    ):
        load_config(path)


def test_worker_url_must_be_grpc(tmp_path: Path) -> None:
    """A worker given as http:// is rejected with the expected form."""
    path = tmp_path / "c.toml"
    path.write_text('[engines]\nworkers = ["http://10.0.0.1:30000"]\n')
    with pytest.raises(ConfigError, match="must look like grpc://host:port"):
        load_config(path)


@pytest.mark.parametrize("name", ["m\\u0000x", "m\\nSTOPPING=1", "m\\u202e"])
def test_a_model_name_with_a_control_character_is_refused(tmp_path: Path, name: str) -> None:
    """A NUL would be cut by the engine (its name then never matches); a newline or a
    direction override would forge or garble STATUS and log lines."""
    path = tmp_path / "c.toml"
    path.write_text(f'[[models]]\nname = "{name}"\n[models.sim]\nworkers = 1\n')
    with pytest.raises(ConfigError, match="a model name must hold no control or unprintable"):
        load_config(path)


def test_unparsable_toml_is_an_error(tmp_path: Path) -> None:
    """A file that is not TOML raises ConfigError with the file name."""
    path = tmp_path / "c.toml"
    path.write_text("[gateway\n")
    with pytest.raises(ConfigError, match=r"c\.toml"):
        load_config(path)


def test_policy_must_be_known() -> None:
    """Only the built-in policies are accepted."""
    with pytest.raises(ValueError, match="cache_aware"):
        HomingConfig.model_validate({"router": {"policy": "random"}})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("inf", "Input should be a finite number"),
        ("nan", "Input should be a finite number"),
        ("-1.0", "Input should be greater than or equal to 0"),
    ],
)
def test_cost_weights_must_be_finite_and_non_negative(
    tmp_path: Path, value: str, message: str
) -> None:
    """TOML allows inf and nan; a weight must be a real number >= 0 (the scoring rule
    compares costs), and the error names the file and the key."""
    path = tmp_path / "c.toml"
    path.write_text(f"[router.weights]\ndecode = {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: router.weights.decode: {message}"


def test_stream_interval_defaults_to_auto_up_to_four_tokens_per_chunk() -> None:
    """By default the interval is "auto" (1 until the gateway's loop is the bottleneck), up to
    4, the policy's own default maximum."""
    [model] = load_config(None).served_models()
    assert (model.stream_interval, model.max_stream_interval) == ("auto", 4)
    assert model.max_stream_interval == DEFAULT_MAX_INTERVAL
    [named] = HomingConfig(models=[ModelSettings(name="m")]).served_models()
    assert (named.stream_interval, named.max_stream_interval) == ("auto", DEFAULT_MAX_INTERVAL)


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[engines]\nstream_interval = 4\n", (4, 4)),
        ("[engines]\nstream_interval = 1\n", (1, 4)),
        ('[engines]\nstream_interval = "auto"\nmax_stream_interval = 16\n', ("auto", 16)),
        ('[[models]]\nname = "m"\nstream_interval = "auto"\n', ("auto", 4)),
        ('[[models]]\nname = "m"\nstream_interval = 2\nmax_stream_interval = 4\n', (2, 4)),
    ],
)
def test_stream_interval_reaches_the_served_model(
    tmp_path: Path, toml: str, expected: tuple[object, int]
) -> None:
    """Set under `engines` (one model) or a `[[models]]` entry, the setting is the served
    model's."""
    path = tmp_path / "c.toml"
    path.write_text(toml)
    [model] = load_config(path).served_models()
    assert (model.stream_interval, model.max_stream_interval) == expected


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("0", "0"),
        ("-2", "-2"),
        ('"fast"', "'fast'"),
        ('"4"', "'4'"),
        ("2.0", "2.0"),
        ("true", "True"),
        ("2147483648", "2147483648"),
    ],
)
def test_stream_interval_is_an_integer_of_at_least_one_or_auto(
    tmp_path: Path, value: str, shown: str
) -> None:
    """Anything but an integer from 1 (to int32's maximum, the protocol's type) or the
    string "auto" is an error naming the key and the value."""
    path = tmp_path / "c.toml"
    path.write_text(f'[[models]]\nname = "m"\nstream_interval = {value}\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: models.0.stream_interval: Value error, must be an integer from 1 to"
        f' 2147483647 or "auto", got {shown}'
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "Input should be greater than or equal to 1"),
        ('"8"', "Input should be a valid integer"),
        ("true", "Input should be a valid integer"),
    ],
)
def test_max_stream_interval_is_an_integer_of_at_least_one(
    tmp_path: Path, value: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[engines]\nmax_stream_interval = {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: engines.max_stream_interval: {message}"


def test_the_slo_defaults_to_the_seeds_targets() -> None:
    """p95 TTFT 500 ms, p95 TPOT 50 ms, the per-request rule the same, objective 0.95; the
    request metrics on, tenant labels off."""
    config = load_config(None)
    slo = config.slo
    assert (slo.ttft_p95_s, slo.tpot_p95_s, slo.request_ttft_s, slo.request_tpot_s) == (
        0.5, 0.05, None, None
    )  # fmt: skip
    assert slo.objective == 0.95
    assert (config.obs.request_metrics, config.obs.tenant_labels) == (True, False)
    [model] = config.served_models()
    assert model.slo is None  # the [slo] section applies


def test_a_model_may_have_its_own_slo(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[slo]\nttft_p95_s = 1.0\n\n"
        '[[models]]\nname = "a"\nslo = { ttft_p95_s = 2.0, request_tpot_s = 0.1 }\n\n'
        '[[models]]\nname = "b"\n'
    )
    config = load_config(path)
    a, b = config.served_models()
    assert a.slo is not None and (a.slo.ttft_p95_s, a.slo.request_tpot_s) == (2.0, 0.1)
    assert b.slo is None and config.slo.ttft_p95_s == 1.0


@pytest.mark.parametrize(
    ("toml", "where", "message"),
    [
        ("[slo]\nobjective = 1\n", "slo.objective", "Input should be less than 1"),
        ("[slo]\nobjective = 0\n", "slo.objective", "Input should be greater than 0"),
        ("[slo]\nttft_p95_s = -0.5\n", "slo.ttft_p95_s", "Input should be greater than 0"),
        ("[slo]\ntpot_p95_s = nan\n", "slo.tpot_p95_s", "Input should be a finite number"),
        ("[slo]\nobjective = nan\n", "slo.objective", "Input should be a finite number"),
        ("[slo]\nttft_ms = 500\n", "slo.ttft_ms", "Extra inputs are not permitted"),
        (
            '[[models]]\nname = "m"\nslo = { request_ttft_s = 0 }\n',
            "models.0.slo.request_ttft_s",
            "Input should be greater than 0",
        ),
        (
            "[obs]\ntenant_labels = 3\n",
            "obs.tenant_labels",
            "Input should be a valid boolean",
        ),
        (
            '[obs]\nrequest_metrics = "yes"\n',
            "obs.request_metrics",
            "Input should be a valid boolean",
        ),
        ('[slo]\nobjective = "0.9"\n', "slo.objective", "Input should be a valid number"),
        ("[slo]\nttft_p95_s = true\n", "slo.ttft_p95_s", "Input should be a valid number"),
    ],
)
def test_a_bad_slo_or_obs_setting_names_the_key(
    tmp_path: Path, toml: str, where: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {where}: {message}"
