"""Fixtures shared by unit and integration suites.

Admin sockets: every `App` and every `homing serve` binds the admin API's Unix socket, by
default `$HOMING_STATE_DIR/admin.sock`, and refuses to start while another live server
answers on it. So that tests never meet one another's sockets (nor the user's own
gateway's):
- the session runs with `HOMING_STATE_DIR` set to a fresh directory (set when this file is
  imported, so every fixture and every child process sees it; removed at the end);
- each test gets a directory of its own below it (`_state_dir_per_test`), which the
  `homing serve` processes a test starts inherit;
- each `App` a test builds in this process comes from `helpers.own_app`, which gives it a
  state directory of its own (`App(state_dir=...)`), so module-scoped Apps and several
  Apps at once in one test never share a socket. A config that names `admin.state_dir`
  keeps it (the admin tests use that to share one on purpose).

Parallel runs: `make test` runs the suite on two pytest-xdist workers, then the tests
marked `serial` (timing-sensitive real-process tests) alone. The scheduler
(`pytest_xdist_make_scheduler`) hands out work units so that what is expensive to start is
started once: each module runs whole on one worker (its module-scoped fixtures start
once), every test that runs real SGLang on one worker (one session fleet of SGLang
workers per run, and real SGLang never on both xdist workers at once), and every test
that needs the Kubernetes API server on one worker (one kube-apiserver and etcd per run).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_server import RedisServer

# Short: a Unix socket path has at most 107 bytes.
SESSION_STATE_DIR = tempfile.mkdtemp(prefix="homing-test-")
os.environ["HOMING_STATE_DIR"] = SESSION_STATE_DIR


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(SESSION_STATE_DIR, ignore_errors=True)


TESTS = Path(__file__).parent
#: Modules with tests that need the Kubernetes API server (`k8s_api.kube_api`).
K8S_MODULES = frozenset(
    {
        "integration/test_scaler_kubernetes.py",
        "integration/test_scaler_kubernetes_app.py",
        "integration/test_scaler_leader.py",
    }
)
#: Modules whose claims are about real time (latency verdicts, probe timeouts, loop stalls,
#: watchdogs, terminal refreshes, signals to live processes): marked `serial`, so `make test`
#: runs them alone, with no other test's processes on the cores.
SERIAL_MODULES = frozenset(
    {
        "e2e/test_reload_streams.py",
        "e2e/test_signals.py",
        "e2e/test_systemd.py",
        "e2e/test_top_tmux.py",
        "integration/test_frozen_worker.py",
        "integration/test_health_progress.py",
        "integration/test_outlier_ejection.py",
        "integration/test_outlier_rescue.py",
        "integration/test_prompt_tokenizing.py",
        "integration/test_quota_redis_instances.py",
        "integration/test_replica_stats_attempts.py",
        "integration/test_request_metrics.py",
        "integration/test_rollout.py",
        "integration/test_scaler_leader_redis.py",
        "integration/test_slow_client.py",
        "integration/test_stop_limits.py",
        "unit/daemon/test_watchdog.py",
        "unit/test_obs_loop_busy.py",
    }
)


def work_group(module: str) -> str:
    """The pytest-xdist work unit of a test module (its path under tests/): "sglang" for the
    modules that run real SGLang (tests/protocol), "k8s" for those that need the Kubernetes
    API server, else the module itself. A unit runs whole on one worker."""
    if module.startswith("protocol/"):
        return "sglang"
    if module in K8S_MODULES:
        return "k8s"
    return module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """For `--dist loadscope`: pytest-xdist's `loadscope` scheduling with `work_group` as
    the scope (`loadgroup`'s marks do not reach the scheduler under pytest 9.2, whose node
    ids are no longer set by plugins). Other `--dist` modes keep xdist's own scheduler."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return work_group(module.removeprefix("tests/"))

    return WorkGroupScheduling(config, log)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m serial` (`make test`'s second phase), skip importing the test modules outside
    `SERIAL_MODULES`: none of their tests would be selected (a module is serial by that list
    alone; one that marked its own tests `serial` would not be collected then)."""
    if config.getoption("markexpr") != "serial" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_") or not collection_path.is_relative_to(TESTS):
        return None
    return collection_path.relative_to(TESTS).as_posix() not in SERIAL_MODULES or None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of `SERIAL_MODULES` `serial` (before `-m` selects by mark); move the
    tests marked `stops_session_fleet` after all others (in their work unit, too), so that
    no session worker they stop has to be started again."""
    for item in items:
        if item.path.is_relative_to(TESTS):
            if item.path.relative_to(TESTS).as_posix() in SERIAL_MODULES:
                item.add_marker(pytest.mark.serial)
    items.sort(key=lambda item: item.get_closest_marker("stops_session_fleet") is not None)


@pytest.fixture(autouse=True, scope="session")
def _served_tokenizer() -> Iterator[object]:
    """Holds the simulated workers' tokenizer for the session, so that every `App` a test
    starts in this process shares one (`tokenizer_from_bundle` keeps a tokenizer only while
    something holds it) instead of building its own."""
    from homing.text.served import served_tokenizer_zip
    from homing.text.tokenizer import tokenizer_from_bundle

    yield tokenizer_from_bundle(served_tokenizer_zip())


@pytest.fixture(autouse=True)
def _state_dir_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """`HOMING_STATE_DIR` is a fresh directory for each test (inherited by its children)."""
    monkeypatch.setenv("HOMING_STATE_DIR", tempfile.mkdtemp(prefix="t-", dir=SESSION_STATE_DIR))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port for the whole session."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()
