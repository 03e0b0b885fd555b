"""Launching real SGLang: the command line, free ports, interpreter and device choice, the
process group's stop, the sglang config section and `homing worker`'s bad-input exits."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from homing.cli import build_parser
from homing.config import ConfigError, HomingConfig, SglangSettings, load_config
from homing.embedded import SglangLauncher
from homing.engines.sglang_launch import (
    PYTHON_ENV,
    SglangLaunch,
    SglangProcess,
    build_command,
    check_sglang,
    default_python,
    group_members,
    resolve_device,
    resolve_ports,
    start_sglang,
)
from homing.engines.worker_main import add_worker_arguments, launch_from_args

FIXED = SglangLaunch(
    model_path="/models/tiny",
    port=30000,
    sidecar_port=30001,
    nccl_port=30002,
    kv_events_port=30003,
    python="/venv/bin/python",
)


def option(argv: list[str], flag: str) -> str:
    """The value after `flag` in `argv`."""
    return argv[argv.index(flag) + 1]


def test_cpu_command_has_the_recipe_flags_and_the_cpu_engine_env() -> None:
    """On CPU: smg-grpc mode on the given ports, torch_native attention, sleep on idle,
    warmup skipped, and SGLANG_USE_CPU_ENGINE=1."""
    cmd = build_command(FIXED)
    assert cmd.argv == [
        "/venv/bin/python", "-m", "sglang.launch_server",
        "--model-path", "/models/tiny",
        "--host", "127.0.0.1",
        "--port", "30000",
        "--smg-grpc-mode",
        "--grpc-port", "30000",
        "--smg-http-sidecar-port", "30001",
        "--nccl-port", "30002",
        "--page-size", "16",
        "--max-total-tokens", "65536",
        "--tp-size", "1",
        "--skip-server-warmup",
        "--kv-events-config",
        '{"publisher":"zmq","endpoint":"tcp://127.0.0.1:30003","bind":true,"topic":"kv-events"}',
        "--device", "cpu",
        "--attention-backend", "torch_native",
        "--sleep-on-idle",
    ]  # fmt: skip
    assert cmd.env == {"SGLANG_USE_CPU_ENGINE": "1"}


def test_cuda_command_has_no_cpu_flags_and_no_cpu_env() -> None:
    """On CUDA the device is named and SGLang picks its own attention backend."""
    cmd = build_command(SglangLaunch(**{**FIXED.__dict__, "device": "cuda", "tp": 2}))
    assert option(cmd.argv, "--device") == "cuda"
    assert option(cmd.argv, "--tp-size") == "2"
    for cpu_only in ("--attention-backend", "--sleep-on-idle"):
        assert cpu_only not in cmd.argv
    assert cmd.env == {}


def test_kv_events_publisher_binds_on_loopback() -> None:
    """The KV-event config is JSON with bind true (a listening publisher) on 127.0.0.1:K."""
    config = json.loads(option(build_command(FIXED).argv, "--kv-events-config"))
    assert config == {
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:30003",
        "bind": True,
        "topic": "kv-events",
    }
    assert FIXED.kv_events_endpoint == "tcp://127.0.0.1:30003"
    assert FIXED.url == "grpc://127.0.0.1:30000"


def test_served_name_sizes_and_extra_args_go_on_the_command_line() -> None:
    """The served name, page size and pool size are passed; extra args come last, as given."""
    launch = SglangLaunch(
        **{
            **FIXED.__dict__,
            "served_model_name": "tiny",
            "page_size": 32,
            "max_total_tokens": 1024,
            "extra_args": ("--chunked-prefill-size", "64"),
        }
    )
    argv = build_command(launch).argv
    assert option(argv, "--served-model-name") == "tiny"
    assert option(argv, "--page-size") == "32"
    assert option(argv, "--max-total-tokens") == "1024"
    assert argv[-2:] == ["--chunked-prefill-size", "64"]


def test_command_needs_every_port_set_and_distinct() -> None:
    """A port left at 0 or two equal ports are refused before anything runs."""
    with pytest.raises(ValueError, match=r"kv_events_port must be in 1\.\.65535"):
        build_command(SglangLaunch(**{**FIXED.__dict__, "kv_events_port": 0}))
    with pytest.raises(ValueError, match="ports must differ"):
        build_command(SglangLaunch(**{**FIXED.__dict__, "nccl_port": 30000}))
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        build_command(SglangLaunch(**{**FIXED.__dict__, "page_size": 0}))


def test_port_zero_gets_distinct_free_ports_and_given_ones_are_kept() -> None:
    """resolve_ports fills every 0 with a distinct bindable port and leaves the others."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        given = s.getsockname()[1]
    launch = resolve_ports(SglangLaunch(model_path="/m", port=given))
    ports = [launch.port, launch.sidecar_port, launch.nccl_port, launch.kv_events_port]
    assert launch.port == given
    assert all(ports) and len(set(ports)) == 4
    build_command(launch)  # every port is set now
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_busy_given_port_is_reported_by_name() -> None:
    """A port in use is an OSError naming the option and the address."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=rf"sidecar_port 127\.0\.0\.1:{port} cannot be bound"):
            resolve_ports(SglangLaunch(model_path="/m", sidecar_port=port))


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_auto_device_is_cuda_only_when_nvidia_smi_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No nvidia-smi or a failing one: cpu; one that exits 0: cuda; explicit values stay."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_device("auto") == "cpu"
    _script(tmp_path / "nvidia-smi", "exit 9")
    assert resolve_device("auto") == "cpu"
    _script(tmp_path / "nvidia-smi", "exit 0")
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        resolve_device("tpu")


def test_python_comes_from_the_env_then_a_venv_sglang_here(tmp_path: Path) -> None:
    """$HOMING_SGLANG_PYTHON wins; else .venv-sglang/bin/python under the directory given."""
    venv_python = tmp_path / ".venv-sglang" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.touch()
    assert default_python({PYTHON_ENV: "/opt/py"}, cwd=tmp_path) == "/opt/py"
    assert default_python({}, cwd=tmp_path) == str(venv_python)


def test_an_interpreter_without_sglang_is_refused_with_the_reason() -> None:
    """homing's own venv has no sglang: the error names the interpreter and why."""
    with pytest.raises(ValueError, match=r"sglang cannot be imported with .* \(not installed\)"):
        check_sglang(sys.executable)
    with pytest.raises(ValueError, match="does not exist"):
        check_sglang("/no/such/python")


async def test_a_worker_that_exits_before_serving_is_reported_with_its_code() -> None:
    """`python -m sglang.launch_server` without sglang exits 1: RuntimeError naming it."""
    launch = resolve_ports(SglangLaunch(model_path="/m", python=sys.executable))
    with pytest.raises(RuntimeError, match="exited with code 1 before it served"):
        await start_sglang(launch, startup_timeout_s=60)


async def test_a_worker_that_never_serves_times_out_and_its_group_is_stopped(
    tmp_path: Path,
) -> None:
    """A stand-in `sglang.launch_server` that only sleeps: TimeoutError, nothing left."""
    root = _stand_in_sglang(tmp_path, "import time\ntime.sleep(600)\n")
    launch = resolve_ports(SglangLaunch(model_path="/m", python=sys.executable))
    environ = {**os.environ, "PYTHONPATH": str(root)}
    with pytest.raises(TimeoutError, match="did not serve within 2 s"):
        await start_sglang(launch, startup_timeout_s=2, environ=environ)
    # the stand-in's command line names its port
    assert _pids_running(f"--port {launch.port} --smg-grpc-mode") == []


def _stand_in_sglang(root: Path, body: str) -> Path:
    """A package `sglang` under `root` whose `launch_server` module runs `body`."""
    package = root / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(body)
    return root


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


async def test_sglang_dies_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """SIGKILL the launcher while SGLang (a stand-in that records its pid, then sleeps)
    starts: Linux SIGTERMs SGLang, which exits."""
    pid_file = tmp_path / "sglang.pid"
    root = _stand_in_sglang(
        tmp_path,
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n",
    )
    launcher = (
        "import asyncio, sys\n"
        "from homing.engines.sglang_launch import SglangLaunch, resolve_ports, start_sglang\n"
        "launch = resolve_ports(SglangLaunch(model_path='/m', python=sys.executable))\n"
        "asyncio.run(start_sglang(launch, startup_timeout_s=600))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    parent = await asyncio.create_subprocess_exec(sys.executable, "-c", launcher, env=env)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the stand-in SGLang never started"
            await asyncio.sleep(0.05)
        sglang_pid = int(pid_file.read_text())
        assert _alive(sglang_pid)
        parent.kill()
        await parent.wait()
        deadline = time.monotonic() + 10
        while _alive(sglang_pid):
            assert time.monotonic() < deadline, "SGLang outlived the process that started it"
            await asyncio.sleep(0.05)
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()


def _pids_running(pattern: str) -> list[int]:
    done = subprocess.run(
        ["pgrep", "-f", "--", pattern], capture_output=True, text=True, check=False
    )
    return [int(pid) for pid in done.stdout.split()]


async def test_stop_kills_a_child_that_ignores_sigterm_and_leaves_no_group_member() -> None:
    """The leader exits on SIGTERM but its child ignores it: SIGKILL after the grace period
    ends the child too, and /proc shows no live member of the group."""
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    leader = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", leader, stdout=asyncio.subprocess.PIPE, start_new_session=True
    )
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 30) == b"up\n"
    deadline = time.monotonic() + 30
    while len(group_members(process.pid)) < 2:  # the child has started
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    worker = SglangProcess(SglangLaunch(model_path="/m"), process)
    await worker.stop(grace_s=1.0)
    assert process.returncode == -signal.SIGTERM
    assert group_members(process.pid) == []


def test_config_needs_a_model_path_to_launch_sglang(tmp_path: Path) -> None:
    """launch = "sglang" without sglang.model_path is an error; listed workers need none."""
    path = tmp_path / "c.toml"
    path.write_text('[engines]\nlaunch = "sglang"\n')
    with pytest.raises(ConfigError, match=r'engines\.launch = "sglang" needs sglang\.model_path'):
        load_config(path)
    path.write_text('[engines]\nlaunch = "sglang"\nworkers = ["grpc://127.0.0.1:30000"]\n')
    assert not load_config(path).embedded
    model = tmp_path / "model"
    model.mkdir()
    body = f'[engines]\nlaunch = "sglang"\n[sglang]\nmodel_path = "{model}"\nworkers = 3\n'
    path.write_text(body)
    with pytest.raises(ConfigError, match=f"model directory {model} has no config.json"):
        load_config(path)
    (model / "config.json").write_text("{}")
    config = load_config(path)
    assert (config.sglang.workers, config.sglang.health_timeout_s) == (3, 20.0)
    assert HomingConfig().engines.launch == "sim"


def test_serve_workers_option_does_not_clash_with_worker_urls() -> None:
    """`--workers N` (launched workers) and `--worker URL` (listed ones) are separate."""
    args = build_parser().parse_args(
        ["serve", "--engine", "sglang", "--model", "/m", "--workers", "3"]
    )
    assert (args.engine, args.model, args.launch_workers, args.workers) == (
        "sglang",
        "/m",
        3,
        None,
    )
    args = build_parser().parse_args(["serve", "--worker", "grpc://127.0.0.1:1"])
    assert args.workers == ["grpc://127.0.0.1:1"] and args.launch_workers is None


def run_homing(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "homing", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_worker_with_a_missing_model_dir_exits_2_with_one_line() -> None:
    """Nothing starts: exit 2, one `homing worker:` line on stderr, nothing on stdout."""
    done = run_homing("worker", "--model", "/no/such/model")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "homing worker: model directory /no/such/model does not exist\n"


def test_worker_with_no_config_json_or_no_sglang_exits_2(tmp_path: Path) -> None:
    """A directory without config.json, then an interpreter without sglang: exit 2 each."""
    done = run_homing("worker", "--model", str(tmp_path))
    assert (done.returncode, done.stderr) == (
        2,
        f"homing worker: model directory {tmp_path} has no config.json\n",
    )
    (tmp_path / "config.json").write_text("{}")
    done = run_homing("worker", "--model", str(tmp_path), "--python", sys.executable)
    assert done.returncode == 2
    assert done.stderr.startswith(f"homing worker: sglang cannot be imported with {sys.executable}")
    assert done.stderr.count("\n") == 1


def test_serve_with_engine_sglang_and_no_model_exits_2() -> None:
    """`homing serve --engine sglang` without --model is refused before anything starts."""
    done = run_homing("serve", "--engine", "sglang", "--port", "0", "--grpc-port", "0")
    assert done.returncode == 2
    assert done.stderr == (
        'homing: invalid option: engines.launch = "sglang" needs sglang.model_path (--model)\n'
    )


@pytest.mark.parametrize(
    ("model", "why"),
    [
        ("/no/such/model", "model directory /no/such/model does not exist"),
        (__file__, f"model path {__file__} is not a directory"),
    ],
)
def test_serve_with_engine_sglang_and_a_bad_model_exits_2_with_one_line(
    model: str, why: str
) -> None:
    """A model path that cannot be a model is refused in one line before any worker starts."""
    done = run_homing("serve", "--engine", "sglang", "--model", model, "--port", "0")
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        f"homing: invalid option: {why}\n",
    )


def test_worker_arguments_parse_repeatable_sglang_args() -> None:
    """`--sglang-arg` collects pass-through arguments in order."""
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    model = Path(__file__).parent  # any directory; config.json is checked below
    args = parser.parse_args(
        ["--model", str(model), "--sglang-arg=--chunked-prefill-size", "--sglang-arg", "64"]
    )
    assert args.sglang_arg == ["--chunked-prefill-size", "64"]
    with pytest.raises(ValueError, match=r"has no config\.json"):
        launch_from_args(args)


def test_launcher_args_parse_as_a_worker_command_line() -> None:
    """SglangLauncher's child arguments are `homing worker` options: the router's block size
    as page size, the settings, the parent pid and each extra arg passed through."""
    settings = SglangSettings(
        model_path="/m", python="/py", device="cpu", extra_args=["--chunked-prefill-size", "64"]
    )
    argv = SglangLauncher(settings, page_size=32)._args()
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    assert (args.model, args.port, args.page_size, args.device, args.python) == (
        "/m",
        0,
        32,
        "cpu",
        "/py",
    )
    assert (args.max_total_tokens, args.tp, args.startup_timeout_s) == (65536, 1, 300.0)
    assert args.parent_pid == os.getpid()
    assert args.sglang_arg == ["--chunked-prefill-size", "64"]
