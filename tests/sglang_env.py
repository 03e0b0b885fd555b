"""Where the real SGLang worker's env and model are (built by `make sglang-cpu`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
TINY_MODEL = ROOT / ".cache" / "sglang-cpu" / "tiny-llama"


def sglang_missing() -> str | None:
    """Why the real SGLang worker cannot run here, or None when it can."""
    if not SGLANG_PYTHON.exists():
        return f"{SGLANG_PYTHON} is missing: run `make sglang-cpu`"
    if not (TINY_MODEL / "config.json").exists():
        return f"the tiny model {TINY_MODEL} is missing: run `make sglang-cpu`"
    return None


def require_sglang() -> None:
    """Skip the calling test when the real SGLang worker cannot run here (with the reason);
    fail instead under `make test`, which sets HOMING_REQUIRE_SGLANG=1 after building it."""
    reason = sglang_missing()
    if reason is None:
        return
    if os.environ.get("HOMING_REQUIRE_SGLANG") == "1":
        pytest.fail(f"HOMING_REQUIRE_SGLANG=1 but {reason}")
    pytest.skip(reason)


def fast_start_env() -> dict[str, str]:
    """Environment that shortens a real worker's startup for the tiny Llama: SGLang imports
    every module of `sglang.srt.models` (~250) to build its registry, and
    `SGLANG_DISABLED_MODEL_ARCHS` (SGLang's own variable) skips all but `llama` (57 s -> 34 s
    measured here). Empty when the package is not where the venv keeps it."""
    venv = SGLANG_PYTHON.parent.parent
    names = sorted(
        path.stem
        for path in venv.glob("lib/python3*/site-packages/sglang/srt/models/*.py")
        if path.stem not in ("llama", "__init__", "registry")
    )
    return {"SGLANG_DISABLED_MODEL_ARCHS": ",".join(names)} if names else {}
