"""The `local` and `exec` actuators start, report and stop real worker processes.

Local: simulated workers (`SimLauncher`) and a command template running `homing sim` as a
command, each a real process on loopback; exec: a real script (tests/data/exec_actuator.py)
that hands out URLs of simulated workers the test started. Ordered by polling `members()`
and the script's call log with a deadline, never by fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import eventually
from structlog.testing import capture_logs

from homing.clock import ManualClock, SystemClock
from homing.config import SimSettings
from homing.embedded import SimLauncher
from homing.engines.client import EngineClient
from homing.scaler.actuators.base import ActuatorError, MemberState
from homing.scaler.actuators.exec import ExecActuator
from homing.scaler.actuators.local import CommandSpawner, CommandTemplate, LocalActuator

SCRIPT = Path(__file__).resolve().parent.parent / "data" / "exec_actuator.py"
FAST_SIM = SimSettings(workers=1, speedup=10.0)
SIM_COMMAND = [sys.executable, "-m", "homing", "sim", "--port", "{port}", "--speedup", "10"]
NEVER_READY = [sys.executable, "-c", "import time; time.sleep(120)"]


def alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def model_name(url: str) -> str:
    client = EngineClient(url, worker_id=url)
    try:
        return (await client.model_info()).served_model_name
    finally:
        await client.close()


async def test_local_sim_members_start_ready_answer_and_stop_without_leftovers() -> None:
    actuator = LocalActuator.for_sim(FAST_SIM, clock=SystemClock(), stop_grace_s=5.0)
    changes: list[list[MemberState]] = []
    actuator.subscribe(lambda: changes.append([m.state for m in actuator.members()]))
    try:
        await actuator.start(2)
        assert [m.state for m in actuator.members()] == [MemberState.STARTING] * 2
        assert changes[0] == [MemberState.STARTING] * 2
        assert await eventually(
            lambda: [m.state for m in actuator.members()] == [MemberState.READY] * 2, 60
        )
        members = actuator.members()
        urls = [m.url for m in members]
        assert None not in urls and len(set(urls)) == 2
        for url in urls:
            assert url is not None
            assert await model_name(url) == "llama-3.1-8b"
        assert all(m.ready_at is not None and m.ready_at > m.asked_at for m in members)
        cold = actuator.cold_start_s()
        assert cold is not None and cold > 0
        pids = [actuator.pid(m.member_id) for m in members]
        assert all(p is not None and alive(p) for p in pids)

        await actuator.stop(members[0].member_id)
        assert pids[0] is not None and not alive(pids[0])
        assert [m.member_id for m in actuator.members()] == [members[1].member_id]
        assert [MemberState.STOPPING, MemberState.READY] in changes
    finally:
        await actuator.close()
    assert actuator.members() == []
    assert pids[1] is not None and not alive(pids[1])
    assert actuator.failed_starts == 0


async def test_local_command_template_serves_a_real_engine_and_logs_to_its_file(
    tmp_path: Path,
) -> None:
    template = CommandTemplate(SIM_COMMAND)
    actuator = LocalActuator.for_command(
        template, model="llama-3.1-8b", clock=SystemClock(), log_dir=tmp_path, stop_grace_s=5.0
    )
    try:
        await actuator.start(1)
        (member,) = actuator.members()
        assert member.state is MemberState.STARTING
        assert await eventually(lambda: actuator.members()[0].state is MemberState.READY, 60)
        (member,) = actuator.members()
        assert member.url is not None and member.url.startswith("grpc://127.0.0.1:")
        assert await model_name(member.url) == "llama-3.1-8b"
        pid = actuator.pid(member.member_id)
        assert pid is not None and alive(pid)
    finally:
        await actuator.close()
    assert not alive(pid)
    assert actuator.members() == []
    assert "serving 1 simulated worker" in (tmp_path / f"{member.member_id}.log").read_text()


async def test_a_command_that_exits_at_once_is_a_failed_start_with_its_status_and_log(
    tmp_path: Path,
) -> None:
    template = CommandTemplate(
        [sys.executable, "-c", "import sys; print('no GPU here', file=sys.stderr); sys.exit(3)"]
    )
    actuator = LocalActuator.for_command(template, model="m", clock=SystemClock(), log_dir=tmp_path)
    with capture_logs() as logs:
        await actuator.start(1)
        assert await eventually(lambda: actuator.failed_starts == 1, 30)
    await actuator.close()
    assert actuator.members() == []
    (failed,) = [e for e in logs if e["event"] == "scaler_start_failed"]
    assert "exited with status 3" in failed["reason"]
    assert "no GPU here" in failed["reason"]


@pytest.mark.parametrize("kind", ["bare name", "no such file", "a directory", "not executable"])
async def test_a_template_whose_program_cannot_run_is_a_failed_start_naming_why(
    tmp_path: Path, kind: str
) -> None:
    """The program is checked before anything is spawned: a bare name not on PATH, a path
    to nothing, a directory, a file without the execute bit."""
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    program, why = {
        "bare name": ("no-such-program-xyz", "'no-such-program-xyz' is not a program on PATH"),
        "no such file": (
            str(tmp_path / "nope"),
            f"'{tmp_path / 'nope'}' is not a program (no such file)",
        ),
        "a directory": (str(tmp_path), f"'{tmp_path}' is not a program (a directory)"),
        "not executable": (str(plain), f"'{plain}' is not a program (not executable)"),
    }[kind]
    template = CommandTemplate([program, "--port", "{port}"])
    actuator = LocalActuator.for_command(template, model="m", clock=SystemClock())
    with capture_logs() as logs:
        await actuator.start(1)
        assert await eventually(lambda: actuator.failed_starts == 1, 30)
    await actuator.close()
    (failed,) = [e for e in logs if e["event"] == "scaler_start_failed"]
    assert failed["reason"] == why


async def test_a_start_past_its_timeout_fails_and_kills_the_process() -> None:
    clock = ManualClock()
    actuator = LocalActuator(
        LocalActuator.for_command(CommandTemplate(NEVER_READY), model="m").spawner,
        clock=clock,
        startup_timeout_s=30.0,
    )
    await actuator.start(1)
    member_id = actuator.members()[0].member_id
    assert await eventually(lambda: actuator.pid(member_id) is not None, 30)
    pid = actuator.pid(member_id)
    assert pid is not None and alive(pid)
    clock.advance(29.0)
    await clock.settle()
    assert actuator.members()[0].state is MemberState.STARTING
    with capture_logs() as logs:
        clock.advance(1.0)
        assert await eventually(lambda: actuator.failed_starts == 1, 30)
    assert actuator.members() == []
    assert not alive(pid)
    assert "did not answer within 30 s" in logs[-1]["reason"]
    await actuator.close()


async def test_close_cancels_a_start_in_flight_and_leaves_no_process() -> None:
    actuator = LocalActuator.for_command(
        CommandTemplate(NEVER_READY), model="m", clock=SystemClock()
    )
    await actuator.start(2)
    ids = [m.member_id for m in actuator.members()]
    assert await eventually(lambda: all(actuator.pid(m) is not None for m in ids), 30)
    pids = [actuator.pid(m) for m in ids]
    assert all(p is not None and alive(p) for p in pids)
    await actuator.close()
    assert actuator.members() == []
    assert [p for p in pids if p is not None and alive(p)] == []
    assert actuator.failed_starts == 0
    with pytest.raises(ActuatorError, match="closed"):
        await actuator.start(1)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["serve", "--port", "{prot}"], "unknown placeholder {prot}"),
        (["serve", "{}"], "unknown placeholder {}"),
        ([], "argv is empty"),
    ],
)
def test_a_bad_template_is_refused_up_front(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CommandTemplate(argv)


def test_a_template_fills_in_its_placeholders() -> None:
    template = CommandTemplate(
        ["run", "--model-path", "{model}", "--bind={host}:{port}", "{{literal}}"],
        env={"REPLICA": "r{index}"},
    )
    argv, env = template.render(port=4242, model="/m/llama", index=7)
    assert argv == ["run", "--model-path", "/m/llama", "--bind=127.0.0.1:4242", "{literal}"]
    assert env == {"REPLICA": "r7"}


# -- exec ----------------------------------------------------------------------------------


@pytest.fixture
async def sim_urls() -> AsyncIterator[list[str]]:
    launcher = SimLauncher(SimSettings(workers=2, speedup=10.0))
    urls = await launcher.start()
    try:
        yield urls
    finally:
        await launcher.stop()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EXEC_STATE", str(tmp_path))
    (tmp_path / "calls").write_text("")
    return tmp_path


def calls(state: Path) -> list[str]:
    return (state / "calls").read_text().splitlines()


def exec_actuator() -> ExecActuator:
    return ExecActuator([sys.executable, str(SCRIPT)], clock=SystemClock(), poll_s=0.05)


async def test_exec_scales_lists_probes_and_stops_through_the_script(
    state: Path, sim_urls: list[str]
) -> None:
    (state / "pool").write_text(sim_urls[0] + "\n")
    actuator = exec_actuator()
    try:
        await actuator.start(2)
        assert "scale 2 stop=" in calls(state)
        assert [(m.member_id, m.url) for m in actuator.members()] == [
            ("job-0", sim_urls[0]),
            ("job-1", None),
        ]
        assert await eventually(lambda: actuator.members()[0].state is MemberState.READY, 30)
        assert actuator.members()[1].state is MemberState.STARTING
        assert actuator.cold_start_s() is not None

        (state / "pool").write_text("\n".join(sim_urls) + "\n")  # the second job got a node
        assert await eventually(
            lambda: [m.state for m in actuator.members()] == [MemberState.READY] * 2, 30
        )
        assert actuator.members()[1].url == sim_urls[1]
        assert "list stop=" in calls(state)

        await actuator.stop("job-0")
        assert "scale 1 stop=job-0" in calls(state)
        assert [m.member_id for m in actuator.members()] == ["job-1"]
        assert actuator.failed_starts == 0
    finally:
        await actuator.close()
    after_close = len(calls(state))
    # closed: no more polls (wait for one poll interval's worth of script runs to not come)
    assert not await eventually(lambda: len(calls(state)) > after_close, 0.5)


async def test_exec_script_failures_raise_with_status_and_stderr_line(state: Path) -> None:
    actuator = exec_actuator()
    try:
        (state / "fail").write_text("scale")
        with pytest.raises(ActuatorError, match="exited with status 4: boom scale"):
            await actuator.start(1)
        (state / "fail").unlink()
        (state / "garbage").write_text("scale")
        with pytest.raises(ActuatorError, match="malformed list"):
            await actuator.start(1)
        with pytest.raises(ActuatorError, match="no member"):
            await actuator.stop("job-99")
    finally:
        await actuator.close()


async def test_exec_script_that_leaves_a_process_running_returns_when_it_exits(
    tmp_path: Path,
) -> None:
    """`worker &` without a redirect: the script exits while its background child still has
    its stdout. The call ends with the script (not at `timeout_s`), its members are read,
    and the child is left running (it may be the user's replica)."""
    pid_file = tmp_path / "child.pid"
    script = f'sleep 30 & echo $! > {pid_file}; echo "m1 -"'
    actuator = ExecActuator(["sh", "-c", script, "sh"], clock=SystemClock(), timeout_s=20.0)
    try:
        started = time.monotonic()
        await actuator.start(1)
        assert time.monotonic() - started < 10.0
        assert [(m.member_id, m.url) for m in actuator.members()] == [("m1", None)]
        assert alive(int(pid_file.read_text()))
    finally:
        await actuator.close()
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


async def test_exec_script_printing_past_the_output_cap_is_refused(tmp_path: Path) -> None:
    code = "import sys; sys.stdout.write('x' * (1024 * 1024 + 1))"
    actuator = ExecActuator([sys.executable, "-c", code], clock=SystemClock())
    try:
        with pytest.raises(ActuatorError) as caught:
            await actuator.start(1)
        assert str(caught.value) == (
            f"{f'{sys.executable} -c {code} scale 1'!r}: printed more than 1048576 bytes"
        )
    finally:
        await actuator.close()


async def test_exec_script_printing_without_end_is_stopped_at_the_cap_not_the_timeout() -> None:
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"
    actuator = ExecActuator([sys.executable, "-c", code], clock=SystemClock(), timeout_s=60.0)
    try:
        started = time.monotonic()
        with pytest.raises(ActuatorError) as caught:
            await actuator.start(1)
        assert time.monotonic() - started < 30.0
        assert str(caught.value) == (
            f"{f'{sys.executable} -c {code} scale 1'!r}: printed more than 1048576 bytes"
        )
    finally:
        await actuator.close()


async def test_exec_failing_list_keeps_the_members_and_logs(
    state: Path, sim_urls: list[str]
) -> None:
    (state / "pool").write_text(sim_urls[0] + "\n")
    actuator = exec_actuator()
    try:
        await actuator.start(1)
        assert await eventually(lambda: actuator.members()[0].state is MemberState.READY, 30)
        before = actuator.members()
        with capture_logs() as logs:
            (state / "fail").write_text("list")
            seen = len(calls(state))
            assert await eventually(lambda: len(calls(state)) >= seen + 2, 30)
        assert actuator.members() == before
        assert any(e["event"] == "scaler_list_failed" and "boom list" in e["error"] for e in logs)
    finally:
        await actuator.close()


async def test_exec_member_that_leaves_the_list_unready_is_a_failed_start(state: Path) -> None:
    actuator = exec_actuator()
    try:
        await actuator.start(1)
        assert [m.state for m in actuator.members()] == [MemberState.STARTING]
        with capture_logs() as logs:
            (state / "members.json").write_text(json.dumps([]))  # the job died in the queue
            assert await eventually(lambda: actuator.failed_starts == 1, 30)
        assert actuator.members() == []
        assert [e["member"] for e in logs if e["event"] == "scaler_start_failed"] == ["job-0"]
    finally:
        await actuator.close()


async def test_exec_member_not_ready_within_its_startup_timeout_is_given_up_and_stopped(
    state: Path,
) -> None:
    clock = ManualClock()
    actuator = ExecActuator(
        [sys.executable, str(SCRIPT)], clock=clock, poll_s=2.0, startup_timeout_s=10.0
    )
    try:
        await actuator.start(1)  # no worker in the pool: job-0 stays "-"
        assert [m.state for m in actuator.members()] == [MemberState.STARTING]
        with capture_logs() as logs:
            clock.advance(12.0)  # the next poll finds it 12 s old
            assert await eventually(lambda: "scale 0 stop=job-0" in calls(state), 30)
        assert actuator.failed_starts == 1
        assert actuator.members() == []
        (failed,) = [e for e in logs if e["event"] == "scaler_start_failed"]
        assert failed["member"] == "job-0" and "not ready within 10 s" in failed["reason"]
    finally:
        await actuator.close()


async def test_local_starts_at_most_max_concurrent_starts_processes_at_once(
    tmp_path: Path,
) -> None:
    """With one start slot, of two members asked for only the first has a process until its
    start ends; the second stays STARTING with none, then starts and serves too. (The first
    may fail to start when another process takes its sim's free port first: the slot is
    then freed all the same.)"""
    actuator = LocalActuator(
        CommandSpawner(CommandTemplate(SIM_COMMAND), model="llama-3.1-8b", log_dir=tmp_path),
        clock=SystemClock(),
        stop_grace_s=5.0,
        max_concurrent_starts=1,
    )
    try:
        await actuator.start(2)
        first, second = (m.member_id for m in actuator.members())
        assert await eventually(lambda: actuator.pid(first) is not None, 30)

        def state(member_id: str) -> MemberState | None:
            return next((m.state for m in actuator.members() if m.member_id == member_id), None)

        while state(first) is MemberState.STARTING:
            assert actuator.pid(second) is None  # waiting for the slot
            await asyncio.sleep(0.01)
        assert await eventually(lambda: state(second) is MemberState.READY, 60)
        if actuator.failed_starts == 0:
            assert state(first) is MemberState.READY
    finally:
        await actuator.close()
