"""`gateway.processes`: a whole number from 1 to `MAX_PROCESSES` or "auto" (one process per
CPU this process may run on), and more than one only with the admin API the other
processes follow the first one through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from homing.config import ConfigError, GatewaySettings, HomingConfig, load_config
from homing.config.gateway import MAX_PROCESSES

NEEDS_ADMIN = (
    "gateway.processes > 1 needs admin.enabled: the other processes follow the first one's "
    "workers through its admin API"
)


def test_one_process_is_the_default() -> None:
    config = HomingConfig()
    assert config.gateway.processes == 1
    assert config.gateway.process_count() == 1


@pytest.mark.parametrize(("toml", "count"), [("1", 1), ("2", 2), ("256", 256)])
def test_a_whole_number_from_1_to_256_is_the_process_count(
    tmp_path: Path, toml: str, count: int
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[gateway]\nprocesses = {toml}\n")
    gateway = load_config(path).gateway
    assert gateway.processes == count
    assert gateway.process_count() == count


def test_the_most_processes_is_256() -> None:
    assert MAX_PROCESSES == 256


def test_auto_is_one_process_per_cpu_this_process_may_run_on(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[gateway]\nprocesses = "auto"\n')
    gateway = load_config(path).gateway
    assert gateway.processes == "auto"
    assert gateway.process_count() == len(os.sched_getaffinity(0))


def test_auto_is_capped_at_256_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with more usable CPUs than `MAX_PROCESSES` runs `MAX_PROCESSES`."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(300)))
    assert GatewaySettings(processes="auto").process_count() == 256


@pytest.mark.parametrize(
    ("toml", "shown"),
    [
        ("0", "0"),
        ("-1", "-1"),
        ("257", "257"),
        ('"2"', "'2'"),
        ("true", "True"),
        ("2.0", "2.0"),
        ('"AUTO"', "'AUTO'"),
    ],
)
def test_a_processes_value_other_than_1_to_256_or_auto_is_refused_naming_the_key(
    tmp_path: Path, toml: str, shown: str
) -> None:
    """Strict: a string of digits, a boolean or a float is not a number of processes; the
    message names what is accepted and what was given."""
    path = tmp_path / "c.toml"
    path.write_text(f"[gateway]\nprocesses = {toml}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f'{path}: gateway.processes: Value error, must be an integer from 1 to 256 or "auto", '
        f"got {shown}"
    )


@pytest.mark.parametrize("value", [True, "2", 0, 257, 2.0])
def test_the_gateway_section_refuses_a_processes_value_that_is_not_an_int_in_range(
    value: object,
) -> None:
    with pytest.raises(ValidationError) as err:
        GatewaySettings(processes=value)
    assert [e["loc"] for e in err.value.errors()] == [("processes",)]


def test_several_processes_without_the_admin_api_are_refused_in_a_file(tmp_path: Path) -> None:
    """The rule spans two sections, so the message stands without a key before it."""
    path = tmp_path / "c.toml"
    path.write_text("[gateway]\nprocesses = 2\n[admin]\nenabled = false\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {NEEDS_ADMIN}"


def test_several_processes_without_the_admin_api_are_refused_by_the_model() -> None:
    with pytest.raises(ValidationError) as err:
        HomingConfig.model_validate({"gateway": {"processes": 2}, "admin": {"enabled": False}})
    [error] = err.value.errors(include_url=False)
    assert (error["loc"], error["msg"]) == ((), f"Value error, {NEEDS_ADMIN}")


def test_auto_without_the_admin_api_is_refused_whatever_this_machines_cpus() -> None:
    """With "auto" a file may mean several processes on the machine it is used on, so it is
    refused even where it would be one (its validity does not depend on the CPUs)."""
    with pytest.raises(ValidationError) as err:
        HomingConfig.model_validate({"gateway": {"processes": "auto"}, "admin": {"enabled": False}})
    [error] = err.value.errors(include_url=False)
    assert (error["loc"], error["msg"]) == ((), f"Value error, {NEEDS_ADMIN}")


def test_one_process_needs_no_admin_api() -> None:
    config = HomingConfig.model_validate({"gateway": {"processes": 1}, "admin": {"enabled": False}})
    assert (config.gateway.process_count(), config.admin.enabled) == (1, False)


def test_several_processes_with_the_admin_api_on_are_accepted() -> None:
    config = HomingConfig.model_validate({"gateway": {"processes": 4}})
    assert (config.gateway.process_count(), config.admin.enabled) == (4, True)


def test_several_processes_without_the_admin_socket_are_refused_in_a_file(tmp_path: Path) -> None:
    """An admin API on TCP alone is not enough: the followers read the leader's socket."""
    digest = "ab" * 32
    path = tmp_path / "c.toml"
    path.write_text(
        '[gateway]\nprocesses = 2\n[admin]\nsocket = ""\nport = 0\n'
        f'[[admin.keys]]\nid = "ops"\nsha256 = "{digest}"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f'{path}: gateway.processes > 1 needs the admin socket (admin.socket = "" turns it '
        "off): the other processes follow the first one's workers through it"
    )
