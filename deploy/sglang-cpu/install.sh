#!/usr/bin/env bash
# Build the SGLang CPU virtual env: ./install.sh VENV (see README.md beside this file).
# Pinned: constraints.txt is a full working set; torch 2.13.0 is the CPU build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=$1
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# This machine's pip config names extra index folders that may be absent: skip those notes.
pip_() { "$venv/bin/python" -m pip --quiet --disable-pip-version-check "$@" 2>&1 |
  { grep -v "^WARNING: Location '.*' is ignored" || true; }; return "${PIPESTATUS[0]}"; }
pip_ install torch==2.13.0
# The CPU build (2.13.0+cpu) is a wheel on this kind of machine's disk (pip's find-links);
# PyPI alone would give the CUDA build, which constraints.txt then refuses.
"$venv/bin/python" -c 'import sys, torch; sys.exit(0 if torch.__version__.endswith("+cpu") else
  f"install.sh: torch {torch.__version__} is not the CPU build 2.13.0+cpu")'
pip_ install -r "$here/requirements.txt" -c "$here/constraints.txt"
pip_ install --no-deps sglang==0.5.23
# Built from a copy, so no build/ folder is left in the source tree.
shim=$(mktemp -d); trap 'rm -rf "$shim"' EXIT
cp -r "$here/sgl_kernel/pyproject.toml" "$here/sgl_kernel/sgl_kernel" "$shim/"
pip_ install --no-deps --force-reinstall "$shim"
pip_ install pytest==9.2.0  # runs the shim's tests
"$venv/bin/python" "$here/fix_torchvision.py"
