"""A launcher whose start fails leaves no child running: the starts still under way are
cancelled (and kill their children) before the failure is raised."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from homing.embedded import _Launcher


def _running_with(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


class _OneBadChild(_Launcher):
    """Two simulated workers; the first asked for has an invalid option and exits at once,
    the second is valid and takes a moment to come up."""

    command = "sim"
    what = "simulated worker"
    event = "test_worker"

    def __init__(self, marker: str) -> None:
        super().__init__(2)
        self.marker = marker
        self.calls = 0

    def _args(self) -> list[str]:
        self.calls += 1
        base = ["--workers", "1", "--port", "0", "--served-model-name", self.marker]
        base += ["--parent-pid", str(os.getpid())]
        return [*base, "--speedup", "-1"] if self.calls == 1 else base


async def test_a_failed_start_leaves_no_child_running() -> None:
    marker = f"launcher-test-{uuid.uuid4().hex}"
    launcher = _OneBadChild(marker)
    with pytest.raises(RuntimeError, match="exited with code 2 before it was ready"):
        await launcher.start(timeout_s=60.0)
    assert launcher.children == []
    assert _running_with(marker) == []


async def test_simulated_workers_start_and_stop_one_at_a_time() -> None:
    """`start_one` adds a worker while the first serves and `stop_one` stops just that one:
    its process exits, the other keeps running."""
    from homing.config import SimSettings
    from homing.embedded import SimLauncher

    marker = f"launcher-test-{uuid.uuid4().hex}"
    launcher = SimLauncher(SimSettings(workers=1, served_model_name=marker))
    try:
        [first] = await launcher.start(timeout_s=60.0)
        second = await launcher.start_one(timeout_s=60.0)
        assert second != first
        assert len(_running_with(marker)) == 2
        stopped = launcher.children[1].process
        await launcher.stop_one(second)
        assert stopped.returncode is not None
        assert [c.url for c in launcher.children] == [first]
        assert len(_running_with(marker)) == 1
        with pytest.raises(KeyError):
            await launcher.stop_one(second)
    finally:
        await launcher.stop()
    assert _running_with(marker) == []
