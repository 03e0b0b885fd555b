"""The `homing` binary's parsers: a sub-command's own parser (`build_parser(name)`, what
`homing NAME` builds) describes it exactly as the whole parser does, and starting one does
not import the modules of the others."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from homing.cli import admin_parser, build_parser

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
