"""The small parts of several gateway processes: a follower's configuration and the plan
file that carries it, the followers' admin key, the restart backoff, and the shared HTTP
listening socket."""

from __future__ import annotations

import errno
import hashlib
import os
import select
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from homing.app.processes import (
    LONGEST_RUNTIME_PATH,
    PROCESS_KEY_ID,
    FollowerPlan,
    Leader,
    follower_config,
    runtime_dir,
    with_process_key,
)
from homing.config import AdminKeySettings, HomingConfig
from homing.config.engines import WorkerEntry
from homing.daemon.followers import bind_http, restart_delay

OPS_DIGEST = "ab" * 32


def two_models() -> HomingConfig:
    """A leader of two named simulated models, one with its own (off) autoscaler, the
    `[scaler]` on, an admin TCP listener with a key, and two processes."""
    return HomingConfig.model_validate(
        {
            "models": [{"name": "a", "scaler": {"enabled": False}}, {"name": "b", "version": "v1"}],
            "scaler": {"enabled": True},
            "admin": {"port": 0, "keys": [{"id": "ops", "sha256": OPS_DIGEST}]},
            "gateway": {"processes": 2},
            "router": {"policy": "round_robin"},
        }
    )


# -- follower_config --


def test_a_follower_of_the_embedded_default_lists_the_leaders_workers_and_launches_none() -> None:
    follower = follower_config(
        HomingConfig(),
        workers=[[("grpc://127.0.0.1:30000", "v1"), ("grpc://127.0.0.1:30001", "v2")]],
        grpc_port=40123,
        state_dir="/run/homing/processes/process-1",
    )
    [model] = follower.served_models()
    assert model.workers == [
        WorkerEntry(url="grpc://127.0.0.1:30000", version="v1"),
        WorkerEntry(url="grpc://127.0.0.1:30001", version="v2"),
    ]
    assert (model.sim, model.scaler) == (None, None)
    assert follower.launched_sim(model) is None
    assert (follower.engines.workers, follower.engines.launch) == ([], "sim")
    assert follower.scaler.enabled is False
    assert (follower.gateway.processes, follower.gateway.grpc_port) == (1, 40123)
    assert (follower.admin.socket, follower.admin.port, follower.admin.state_dir) == (
        "/run/homing/processes/process-1/admin.sock",
        None,
        None,  # the leader's (here the default): its rollout store is the one to follow
    )
    assert follower.admin.socket_path() == "/run/homing/processes/process-1/admin.sock"


def test_a_follower_of_two_named_models_lists_each_models_workers_in_order() -> None:
    follower = follower_config(
        two_models(),
        workers=[
            [("grpc://127.0.0.1:1", "v1")],
            [("grpc://127.0.0.1:2", "v2"), ("grpc://127.0.0.1:3", "v1")],
        ],
        grpc_port=50051,
        state_dir="/tmp/p1",
    )
    a, b = follower.served_models()
    assert (a.name, b.name) == ("a", "b")
    assert a.workers == [WorkerEntry(url="grpc://127.0.0.1:1", version="v1")]
    assert b.workers == [
        WorkerEntry(url="grpc://127.0.0.1:2", version="v2"),
        WorkerEntry(url="grpc://127.0.0.1:3", version="v1"),
    ]
    assert b.version == "v1"  # the rest of each model is the leader's
    for model in (a, b):
        assert (model.sim, model.scaler) == (None, None)
        assert follower.launched_sim(model) is None
        assert follower.scaler_of(model).enabled is False


def test_a_follower_has_no_admin_listener_but_its_socket_and_keeps_the_keys() -> None:
    """The leader's admin TCP port is the leader's alone; the follower's admin API is on
    its own socket in its own directory, while its state directory stays the leader's."""
    follower = follower_config(two_models(), workers=[[], []], grpc_port=50051, state_dir="/tmp/p2")
    admin = follower.admin
    assert (admin.enabled, admin.socket, admin.port, admin.state_dir) == (
        True,
        "/tmp/p2/admin.sock",
        None,
        two_models().admin.state_dir,
    )
    assert admin.keys == [AdminKeySettings(id="ops", sha256=OPS_DIGEST)]


def test_a_follower_keeps_the_leaders_other_settings() -> None:
    leader = two_models()
    follower = follower_config(
        leader, workers=[[("grpc://127.0.0.1:1", "")], []], grpc_port=1, state_dir="/tmp/p"
    )
    assert follower.router == leader.router
    assert follower.tenants == leader.tenants
    assert follower.quotas == leader.quotas
    assert follower.gateway.model_copy(update={"processes": 2, "grpc_port": 50051}) == (
        leader.gateway
    )


def test_a_follower_of_a_leader_listing_engines_workers_lists_them_under_its_model() -> None:
    """`engines.workers` and `[[models]]` may not both be set: the follower's workers are
    its model's only."""
    leader = HomingConfig.model_validate(
        {"engines": {"workers": ["grpc://10.0.0.1:30000"]}, "gateway": {"processes": 2}}
    )
    follower = follower_config(
        leader, workers=[[("grpc://10.0.0.1:30000", "")]], grpc_port=7, state_dir="/tmp/p"
    )
    assert follower.engines.workers == []
    [model] = follower.served_models()
    assert model.workers == [WorkerEntry(url="grpc://10.0.0.1:30000", version="")]


@pytest.mark.parametrize(
    ("lists", "message"), [(1, "1 worker lists for 2 models"), (3, "3 worker lists for 2 models")]
)
def test_worker_lists_other_than_one_per_model_are_a_value_error(lists: int, message: str) -> None:
    with pytest.raises(ValueError) as err:
        follower_config(two_models(), workers=[[]] * lists, grpc_port=1, state_dir="/tmp/p")
    assert str(err.value) == message


def test_the_embedded_default_given_two_worker_lists_is_a_value_error() -> None:
    with pytest.raises(ValueError) as err:
        follower_config(HomingConfig(), workers=[[], []], grpc_port=1, state_dir="/tmp/p")
    assert str(err.value) == "2 worker lists for 1 models"


def test_a_follower_config_that_does_not_validate_is_pydantics_error() -> None:
    """The same worker under two models is refused as in any config."""
    same = [("grpc://127.0.0.1:1", "")]
    with pytest.raises(ValidationError, match="a worker URL is listed twice"):
        follower_config(two_models(), workers=[same, same], grpc_port=1, state_dir="/tmp/p")


# -- FollowerPlan --


def plan_of(config: HomingConfig) -> FollowerPlan:
    return FollowerPlan(
        index=3,
        leader=Leader(admin="unix:/run/homing/admin.sock", key="k-123", quotas="/run/q.sock"),
        http_fd=7,
        config=config,
    )


def test_a_plan_reads_back_as_written(tmp_path: Path) -> None:
    config = follower_config(
        two_models(),
        workers=[[("grpc://127.0.0.1:1", "v1")], [("grpc://127.0.0.1:2", "v2")]],
        grpc_port=50051,
        state_dir=str(tmp_path / "p3"),
    )
    plan = plan_of(config)
    path = tmp_path / "process-3.json"
    plan.write(path)
    back = FollowerPlan.read(path)
    assert back == plan
    assert back.leader == Leader(
        admin="unix:/run/homing/admin.sock", key="k-123", quotas="/run/q.sock"
    )
    assert back.config == config


def test_a_leader_without_key_or_quota_socket_reads_back_as_none(tmp_path: Path) -> None:
    plan = FollowerPlan(
        index=1, leader=Leader(admin="unix:/a.sock"), http_fd=3, config=HomingConfig()
    )
    path = tmp_path / "process-1.json"
    plan.write(path)
    assert FollowerPlan.read(path).leader == Leader(admin="unix:/a.sock", key=None, quotas=None)


def test_a_plan_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """It holds the followers' admin key."""
    path = tmp_path / "process-3.json"
    plan_of(HomingConfig()).write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_rewriting_a_plan_replaces_it_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "process-3.json"
    plan_of(HomingConfig()).write(path)
    newer = plan_of(HomingConfig.model_validate({"router": {"policy": "least_load"}}))
    newer.write(path)
    assert FollowerPlan.read(path) == newer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["process-3.json"]


def test_a_missing_plan_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FollowerPlan.read(tmp_path / "absent.json")


def test_a_plan_with_an_invalid_config_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(
        '{"index": 1, "leader": {"admin": "unix:/a"}, "http_fd": 3,'
        ' "config": {"gateway": {"processes": 0}}}'
    )
    with pytest.raises(ValidationError, match='from 1 to 256 or "auto", got 0'):
        FollowerPlan.read(path)


# -- with_process_key --


def test_the_process_key_is_added_by_its_sha256_beside_the_others() -> None:
    keyed = with_process_key(two_models(), "s3cret")
    assert keyed.admin.keys == [
        AdminKeySettings(id="ops", sha256=OPS_DIGEST),
        AdminKeySettings(id=PROCESS_KEY_ID, sha256=hashlib.sha256(b"s3cret").hexdigest()),
    ]
    assert PROCESS_KEY_ID == "gateway-processes"


def test_a_new_process_key_replaces_the_earlier_one() -> None:
    keyed = with_process_key(with_process_key(two_models(), "first"), "second")
    assert keyed.admin.keys == [
        AdminKeySettings(id="ops", sha256=OPS_DIGEST),
        AdminKeySettings(id=PROCESS_KEY_ID, sha256=hashlib.sha256(b"second").hexdigest()),
    ]


def test_adding_the_process_key_leaves_the_given_config_as_it_was() -> None:
    leader = two_models()
    with_process_key(leader, "s3cret")
    assert leader.admin.keys == [AdminKeySettings(id="ops", sha256=OPS_DIGEST)]


def test_an_admin_api_without_keys_gets_no_process_key() -> None:
    """Its socket's file mode is its only guard, so a key would lock the others out."""
    config = HomingConfig()
    assert with_process_key(config, "s3cret") is config
    assert config.admin.keys == []


# -- restart_delay --


def test_a_first_exit_restarts_after_one_second() -> None:
    assert restart_delay(None, 0.5) == 1.0


def test_quick_exits_double_the_delay_up_to_30_seconds() -> None:
    delays: list[float] = []
    delay: float | None = None
    for _ in range(8):
        delay = restart_delay(delay, 2.0)
        delays.append(delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


@pytest.mark.parametrize(("served_s", "delay"), [(59.9, 30.0), (60.0, 1.0), (3600.0, 1.0)])
def test_an_exit_after_serving_60_seconds_restarts_after_one_second_again(
    served_s: float, delay: float
) -> None:
    assert restart_delay(30.0, served_s) == delay


# -- bind_http --


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    sock = bind_http("127.0.0.1", 0)
    yield sock
    sock.close()


def test_port_0_binds_a_free_port_and_accepts_connections(listening: socket.socket) -> None:
    host, port = listening.getsockname()
    assert host == "127.0.0.1" and port > 0
    assert listening.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    assert listening.getblocking() is False
    with socket.create_connection((host, port), timeout=2) as client:
        ready, _, _ = select.select([listening], [], [], 2)
        assert ready == [listening]
        conn, peer = listening.accept()
        conn.close()
        assert peer == client.getsockname()


def test_an_ipv6_host_gets_an_ipv6_socket() -> None:
    sock = bind_http("::1", 0)
    try:
        assert sock.family == socket.AF_INET6
        assert sock.getsockname()[0] == "::1"
    finally:
        sock.close()


def test_a_port_another_socket_listens_on_is_an_os_error_naming_the_address(
    listening: socket.socket,
) -> None:
    port = listening.getsockname()[1]
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError) as err:
        bind_http("127.0.0.1", port)
    assert err.value.errno == errno.EADDRINUSE
    assert err.value.strerror == f"cannot listen on 127.0.0.1:{port}: Address already in use"
    assert str(err.value) == (
        f"[Errno {errno.EADDRINUSE}] cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert len(os.listdir("/proc/self/fd")) == before  # the failed socket was closed


def test_an_address_not_of_this_host_is_an_os_error_naming_it() -> None:
    with pytest.raises(OSError) as err:
        bind_http("192.0.2.1", 8080)  # TEST-NET-1: on no interface here
    assert err.value.errno == errno.EADDRNOTAVAIL
    assert err.value.strerror == (
        "cannot listen on 192.0.2.1:8080: Cannot assign requested address"
    )


def test_the_runtime_dir_is_the_state_dirs_processes_while_its_sockets_fit() -> None:
    """A follower's admin socket, as the admin server first binds it, is the longest path
    under it; past 107 bytes (Linux's sun_path) the leader makes a shorter private
    directory instead (None here)."""
    short = "/var/lib/homing"
    assert runtime_dir(short, 107) == Path(short) / "processes"
    fits = "/" + "d" * (107 - len("/processes") - LONGEST_RUNTIME_PATH - 1)
    assert runtime_dir(fits, 107) == Path(fits) / "processes"
    assert runtime_dir(fits + "d", 107) is None
