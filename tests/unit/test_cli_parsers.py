"""The `homing` binary's parsers: a sub-command's own parser (`build_parser(name)`, what
`homing NAME` builds) describes it exactly as the whole parser does, and starting one does
not import the modules of the others."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from homing.cli import _serve_config, admin_parser, build_parser
from homing.config import ConfigError

OWN = ("serve", "sim", "worker", "bench", "plan")


def _sub_help(parser: argparse.ArgumentParser, name: str) -> str:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name].format_help()


@pytest.mark.parametrize("name", OWN)
def test_a_sub_commands_own_parser_is_the_whole_parsers(name: str) -> None:
    assert _sub_help(build_parser(name), name) == _sub_help(build_parser(), name)


def test_the_admin_parser_describes_each_verb_as_the_whole_parser_does() -> None:
    whole, admin = build_parser(), admin_parser()
    (sub,) = [a for a in admin._actions if isinstance(a, argparse._SubParsersAction)]
    for name in sub.choices:
        assert _sub_help(admin, name) == _sub_help(whole, name), name


@pytest.mark.parametrize("name", ["completion", "nonsense", None])
def test_other_names_get_every_sub_command(name: str | None) -> None:
    (sub,) = [a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction)]
    assert {*OWN, "workers", "top", "completion"} <= set(sub.choices)


def test_homing_sim_help_imports_neither_the_bench_nor_the_admin_commands() -> None:
    code = (
        "import sys; from homing.cli import main\n"
        "try:\n    main(['sim', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('homing.bench.main', 'homing.admin.commands',"
        " 'homing.engines.worker_main') if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    assert "usage: homing sim" in done.stdout


@pytest.mark.parametrize(("value", "parsed"), [("auto", "auto"), ("1", 1), ("4", 4), ("0", 0)])
def test_serve_processes_takes_auto_or_a_whole_number(value: str, parsed: int | str) -> None:
    """The parser takes any whole number; the config checks its range."""
    args = build_parser("serve").parse_args(["serve", "--processes", value])
    assert args.processes == parsed


def test_serve_processes_defaults_to_the_configs(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[gateway]\nprocesses = 3\n")
    args = build_parser("serve").parse_args(["serve", "--config", str(config)])
    assert args.processes is None
    assert _serve_config(args).gateway.processes == 3


@pytest.mark.parametrize(("value", "parsed"), [("auto", "auto"), ("2", 2)])
def test_serve_processes_overrides_the_configs(
    tmp_path: Path, value: str, parsed: int | str
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[gateway]\nprocesses = 3\n")
    args = build_parser("serve").parse_args(
        ["serve", "--config", str(config), "--processes", value]
    )
    assert _serve_config(args).gateway.processes == parsed


@pytest.mark.parametrize(
    ("value", "shown"),
    [("x", "'x'"), ("2.5", "'2.5'"), ("AUTO", "'AUTO'"), ("y" * 80, repr("y" * 64))],
)
def test_serve_processes_neither_a_number_nor_auto_is_a_usage_error_naming_it(
    value: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with argparse's usage and the value (its first 64 characters) on stderr."""
    with pytest.raises(SystemExit) as exit_:
        build_parser("serve").parse_args(["serve", "--processes", value])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: homing serve ")
    assert err.splitlines()[-1] == (
        f"homing serve: error: argument --processes: {shown} is neither a number nor auto"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--processes", "0"],
            'invalid option: gateway.processes: must be an integer from 1 to 256 or "auto", got 0',
        ),
        (
            ["--processes", "257"],
            'invalid option: gateway.processes: must be an integer from 1 to 256 or "auto", '
            "got 257",
        ),
    ],
)
def test_serve_processes_out_of_range_is_a_config_error(argv: list[str], message: str) -> None:
    args = build_parser("serve").parse_args(["serve", *argv])
    with pytest.raises(ConfigError) as err:
        _serve_config(args)
    assert str(err.value) == message


def test_serve_processes_above_one_with_the_admin_api_off_is_a_config_error(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[admin]\nenabled = false\n")
    args = build_parser("serve").parse_args(["serve", "--config", str(config), "--processes", "2"])
    with pytest.raises(ConfigError) as err:
        _serve_config(args)
    assert str(err.value) == (
        "invalid option: gateway.processes > 1 needs admin.enabled: the other processes "
        "follow the first one's workers through its admin API"
    )
