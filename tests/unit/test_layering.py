"""Packages depend downwards (DESIGN.md, "Layout"): the simulator imports no benchmark, gateway
or composition root, and the benchmarks reach the gateway only as a client (`homing.app.App`
or a `homing serve` process), never through `homing.gateway`.

Every `import` and `from ... import` is collected with `ast`, including ones inside functions
and `if TYPE_CHECKING:` blocks; relative imports are resolved against the module's package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

FORBIDDEN = {
    "homing.sim": ("homing.bench", "homing.gateway", "homing.app", "homing.daemon"),
    "homing.engines": ("homing.daemon", "homing.app", "homing.gateway", "homing.fleet"),
    "homing.bench": ("homing.gateway",),
    "homing.scaler": ("homing.gateway", "homing.app", "homing.daemon", "homing.bench"),
}
"""Package -> the packages its modules may not import (a name or any module under it)."""


def _module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, src: Path = SRC) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file at `path` (under the source
    root `src`); for `from X import a, b` both `X` and `X.a`, `X.b` (a name may be a
    submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = _module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _violates(name: str, forbidden: tuple[str, ...]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


def violations(package: str, src: Path = SRC) -> list[str]:
    """`file:line imports name` for every forbidden import in `package` under `src`."""
    root = src.joinpath(*package.split("."))
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for line, name in imported_modules(path, src):
            if _violates(name, FORBIDDEN[package]):
                out.append(f"{path.relative_to(src)}:{line} imports {name}")
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downwards(package: str) -> None:
    """No module of `package` imports a package above it (see FORBIDDEN)."""
    assert list(SRC.joinpath(*package.split(".")).rglob("*.py")), f"no sources for {package}"
    assert violations(package) == []


def test_the_import_walk_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    """The walk is not fooled by a function-local or relative import."""
    pkg = tmp_path / "homing" / "sim"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    probe = pkg / "probe.py"
    probe.write_text(
        "def f() -> None:\n"
        "    import homing.gateway.auth\n"
        "    from ..bench import traces\n"
        "    from .. import app\n"
    )
    names = {name for _, name in imported_modules(probe, tmp_path)}
    assert {"homing.gateway.auth", "homing.bench.traces", "homing.app"} <= names


#: Decision modules: pure over plain data (DESIGN.md, "Principles" 1), so no I/O module.
PURE = (
    "homing.scaler.policy",
    "homing.scaler.capacity",
    "homing.scaler.budget",
    "homing.scaler.victim",
    "homing.obs.demand",
    "homing.engines.outliers",
)
IO_MODULES = ("asyncio", "socket", "grpc", "aiohttp", "subprocess", "time", "redis", "os")


@pytest.mark.parametrize("module", PURE)
def test_decision_modules_import_no_io(module: str) -> None:
    """A pure decision module imports no I/O, wall clock or event loop module."""
    path = SRC.joinpath(*module.split(".")).with_suffix(".py")
    names = [name for _, name in imported_modules(path)]
    assert [n for n in names if _violates(n, IO_MODULES)] == []
