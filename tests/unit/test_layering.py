"""Packages depend downwards (docs/architecture.md, "Layers"): the simulator imports no
benchmark, gateway or composition root, and the benchmarks reach the gateway only as a client
(`homing.app.App` or a `homing serve` process), never through `homing.gateway`.

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


#: Decision modules: pure over plain data (docs/architecture.md, "Principles" 1), so no I/O
#: module.
PURE = (
    "homing.scaler.policy",
    "homing.scaler.capacity",
    "homing.scaler.budget",
    "homing.scaler.victim",
    "homing.obs.demand",
    "homing.engines.outliers",
    "homing.gateway.failover",
    "homing.gateway.accounting",
    "homing.config.reload_plan",
    "homing.bench.affinity",
)
IO_MODULES = ("asyncio", "socket", "grpc", "aiohttp", "subprocess", "time", "redis", "os")


@pytest.mark.parametrize("module", PURE)
def test_decision_modules_import_no_io(module: str) -> None:
    """A pure decision module imports no I/O, wall clock or event loop module."""
    path = SRC.joinpath(*module.split(".")).with_suffix(".py")
    names = [name for _, name in imported_modules(path)]
    assert [n for n in names if _violates(n, IO_MODULES)] == []


#: Packages that read time and wait only through an injected `homing.clock.Clock`.
ON_THE_CLOCK = (
    "homing.gateway",
    "homing.fleet",
    "homing.router",
    "homing.scaler",
    "homing.rollout",
    "homing.app",
)

#: I/O edges inside them that keep real time, and why.
REAL_TIME_EDGES = {
    # Redis calls time out on the event loop's own clock: a network wait, not a policy one.
    "homing.rollout.store",
    # Compares the Kubernetes API server's creationTimestamps, which are real Unix seconds.
    "homing.scaler.actuators.kubernetes",
    # Writes and reads the Kubernetes Lease's renewTime, which other instances compare with
    # their own real time.
    "homing.scaler.leader_kubernetes",
    # Polls a child process's output pipe while waiting for it to exit.
    "homing.scaler.actuators.exec",
}

_ASYNCIO_WAITS = {"sleep", "timeout", "timeout_at", "wait_for"}
_LOOP_TIME = {"time", "call_at", "call_later"}
_WALL_CLOCKS = {"now", "utcnow", "today"}


def time_reads(path: Path) -> list[str]:
    """`line: what` for every direct read of time or wait on it in the file at `path`: an
    import of `time`, `asyncio.sleep`/`timeout`/`timeout_at`/`wait_for` (attribute, under
    any alias of `asyncio`, or imported name), a `timeout=` given to any asyncio call, an
    event loop's `time`, `call_at` or `call_later`, and `datetime`'s or `date`'s `now`,
    `utcnow` or `today`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    asyncio_names = {"asyncio"} | {
        a.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "asyncio" and a.asname
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import time" for a in node.names if a.name == "time"]
        elif isinstance(node, ast.ImportFrom):
            if node.module == "time":
                found.append(f"{node.lineno}: from time import")
            elif node.module == "asyncio":
                found += [
                    f"{node.lineno}: from asyncio import {a.name}"
                    for a in node.names
                    if a.name in _ASYNCIO_WAITS
                ]
        elif isinstance(node, ast.Attribute):
            owner = node.value
            on_asyncio = isinstance(owner, ast.Name) and owner.id in asyncio_names
            if on_asyncio and node.attr in _ASYNCIO_WAITS:
                found.append(f"{node.lineno}: asyncio.{node.attr}")
            elif node.attr in _LOOP_TIME and _is_loop(owner):
                found.append(f"{node.lineno}: loop.{node.attr}")
            elif node.attr in _WALL_CLOCKS and _names(owner, ("datetime", "date")):
                found.append(f"{node.lineno}: datetime.{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            on_asyncio = (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id in asyncio_names
            )
            if on_asyncio and any(k.arg == "timeout" for k in node.keywords):
                found.append(f"{node.lineno}: asyncio call with timeout=")
    return found


def _names(node: ast.expr, names: tuple[str, ...]) -> bool:
    """Whether `node` is one of `names`, bare or as an attribute (`datetime.datetime`)."""
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.Attribute) and node.attr in names


def _is_loop(node: ast.expr) -> bool:
    """Whether `node` reads as an event loop: a name or attribute ending in `loop`, or a
    call of `get_running_loop` / `get_event_loop`."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in ("get_running_loop", "get_event_loop")
    if isinstance(node, ast.Name):
        return node.id.endswith("loop")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("loop")
    return False


def _modules_on_the_clock(src: Path = SRC) -> list[tuple[str, Path]]:
    out = []
    for package in ON_THE_CLOCK:
        for path in sorted(src.joinpath(*package.split(".")).rglob("*.py")):
            out.append((_module_name(path, src), path))
    return out


def test_the_request_path_and_the_control_loops_read_time_only_through_the_clock() -> None:
    """Nothing in the gateway, fleet, router, scaler, rollout or app reads time or waits
    on it except through its `Clock`, apart from the named real-time I/O edges."""
    modules = _modules_on_the_clock()
    assert len(modules) > 40
    assert REAL_TIME_EDGES <= {name for name, _ in modules}
    found = {
        name: reads
        for name, path in modules
        if name not in REAL_TIME_EDGES and (reads := time_reads(path))
    }
    assert found == {}


def test_the_time_walk_sees_every_kind_of_direct_time_read(tmp_path: Path) -> None:
    """The walk catches each way of reading time or waiting on it directly."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import asyncio\n"
        "import asyncio as aio\n"
        "import time\n"
        "from asyncio import sleep\n"
        "from datetime import UTC, datetime\n"
        "async def f(loop):\n"
        "    await asyncio.sleep(1)\n"
        "    await aio.sleep(1)\n"
        "    async with asyncio.timeout(1):\n"
        "        pass\n"
        "    await asyncio.wait(tasks, timeout=1)\n"
        "    await asyncio.wait(tasks)\n"
        "    asyncio.get_running_loop().time()\n"
        "    loop.call_later(1, print)\n"
        "    self.loop.call_at(1, print)\n"
        "    clock.call_later(1, print)\n"
        "    datetime.now(UTC)\n"
        "    clock.now()\n"
    )
    reads = [r.split(": ", 1)[1] for r in time_reads(probe)]
    assert sorted(reads) == sorted(
        [
            "import time",
            "from asyncio import sleep",
            "asyncio.sleep",
            "asyncio.sleep",
            "asyncio.timeout",
            "asyncio call with timeout=",
            "loop.time",
            "loop.call_later",
            "loop.call_at",
            "datetime.now",
        ]
    )


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the homing modules it imports (anywhere in the file), each import resolved
    to the longest module name it starts with; edges to the module itself and to its own
    ancestor packages are left out (a package's `__init__` may re-export its submodules)."""
    modules = {_module_name(p, src) for p in (src / "homing").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted((src / "homing").rglob("*.py")):
        module = _module_name(path, src)
        out: set[str] = set()
        for _, name in imported_modules(path, src):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                out.add(name)
        graph[module] = out
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan's
    algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def test_no_module_takes_part_in_an_import_cycle() -> None:
    """No homing module imports, directly or through others, a module that imports it back
    (imports inside functions and `TYPE_CHECKING` blocks count)."""
    assert [sorted(c) for c in import_cycles(import_graph())] == []


def test_the_cycle_search_finds_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    """A three-module circle closed by a function-local import is found; a package
    importing its own submodule is not a circle."""
    pkg = tmp_path / "homing" / "p"
    pkg.mkdir(parents=True)
    (tmp_path / "homing" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from homing.p.a import f\n")
    (pkg / "a.py").write_text("from homing.p import b\n\ndef f() -> None:\n    pass\n")
    (pkg / "b.py").write_text("import homing.p.c\n")
    (pkg / "c.py").write_text("def g() -> None:\n    from homing.p.a import f\n")
    cycles = import_cycles(import_graph(tmp_path))
    assert cycles == [frozenset({"homing.p.a", "homing.p.b", "homing.p.c"})]


#: Modules and packages outside `homing.config` that it may import: leaves, importing no
#: homing module outside themselves (their packages' `__init__` included).
CONFIG_LEAVES = ("homing.sim.timing", "homing.text")


def _outside(name: str, package: str) -> bool:
    return name.startswith("homing") and not (name == package or name.startswith(package + "."))


def _ancestors_and_self(module: str) -> list[Path]:
    """The files that importing `module` runs: its ancestor packages' `__init__` and its own."""
    parts = module.split(".")
    files = [SRC.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    own = SRC.joinpath(*parts)
    return [*files, own / "__init__.py" if own.is_dir() else own.with_suffix(".py")]


def test_config_imports_only_leaf_modules() -> None:
    """`homing.config` is the lowest layer: its modules import no homing module outside
    it but the leaves in CONFIG_LEAVES."""
    root = SRC / "homing" / "config"
    paths = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    bad = [
        f"{path.relative_to(SRC)}:{line} imports {name}"
        for path in paths
        for line, name in imported_modules(path)
        if _outside(name, "homing.config") and not _violates(name, CONFIG_LEAVES)
    ]
    assert bad == []


@pytest.mark.parametrize("leaf", CONFIG_LEAVES)
def test_config_leaves_import_no_homing_module(leaf: str) -> None:
    """A module or package that `homing.config` may import imports no homing module outside
    itself."""
    own = SRC.joinpath(*leaf.split("."))
    paths = _ancestors_and_self(leaf) + (sorted(own.rglob("*.py")) if own.is_dir() else [])
    names = [
        f"{path.relative_to(SRC)}:{line} imports {name}"
        for path in paths
        for line, name in imported_modules(path)
        if _outside(name, leaf) and not leaf.startswith(name + ".")
    ]
    assert names == []


#: The shipped test doubles and helpers (docs/architecture.md, "The packages"); every module
#: named `testing` is one, these included.
TESTING_MODULES = (
    "homing.engines.testing",
    "homing.fleet.testing",
    "homing.gateway.testing",
    "homing.obs.testing",
    "homing.router.testing",
)


def _is_testing(module: str) -> bool:
    return module.rpartition(".")[2] == "testing"


def _double_in(name: str) -> str | None:
    """The `testing` module an import of `name` reaches (`x.testing.Y` reaches `x.testing`),
    None for none."""
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        if parts[end - 1] == "testing":
            return ".".join(parts[:end])
    return None


def imports_of_doubles(src: Path = SRC) -> list[str]:
    """`module:line imports double` for every import of a `testing` module by a module that
    is not one itself."""
    out: set[str] = set()
    for path in sorted((src / "homing").rglob("*.py")):
        module = _module_name(path, src)
        if _is_testing(module):
            continue
        for line, name in imported_modules(path, src):
            if (double := _double_in(name)) is not None:
                out.add(f"{module}:{line} imports {double}")
    return sorted(out)


def test_no_production_module_imports_a_test_double() -> None:
    """The `testing` modules (test doubles) are for tests and for one another: no other
    homing module imports one, so nothing of them runs in a served process."""
    found = {_module_name(p, SRC) for p in (SRC / "homing").rglob("testing.py")}
    assert set(TESTING_MODULES) <= found
    assert imports_of_doubles() == []


def test_the_doubles_walk_sees_a_production_import_of_a_double(tmp_path: Path) -> None:
    """An import of a double from a production module is caught, in either spelling and
    inside a function; a double importing another is allowed."""
    pkg = tmp_path / "homing" / "fleet"
    pkg.mkdir(parents=True)
    (tmp_path / "homing" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "dispatch.py").write_text(
        "from homing.engines import testing\n"
        "def f() -> None:\n"
        "    from homing.engines.testing import FakeEngine\n"
    )
    (pkg / "testing.py").write_text("from homing.engines.testing import FakeEngine\n")
    assert imports_of_doubles(tmp_path) == [
        "homing.fleet.dispatch:1 imports homing.engines.testing",
        "homing.fleet.dispatch:3 imports homing.engines.testing",
    ]
