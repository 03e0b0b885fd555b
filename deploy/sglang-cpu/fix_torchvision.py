"""Let PyPI's torchvision 0.28.0 (a CUDA build) import beside CPU torch 2.13.0.

Its `_meta_registrations.py` registers fake kernels for `torchvision::nms` and `::qnms`
unconditionally; without the compiled ops `import torchvision` fails with "operator
torchvision::nms does not exist". This makes both registrations conditional on
`torchvision.extension._has_ops()`, as the file's other registrations already are.
Idempotent; run with the interpreter of the env to fix.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

NAMES = ("nms", "qnms")
MARK = "# homing: conditional on the compiled ops"


def main() -> None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise SystemExit("torchvision is not installed in this env")
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text(encoding="utf-8")
    if MARK in text:
        return
    for name in NAMES:
        decorator = f'@torch.library.register_fake("torchvision::{name}")'
        if text.count(decorator) != 1:
            raise SystemExit(f"{path}: expected one {decorator!r}; torchvision changed?")
        conditional = (
            f'@(torch.library.register_fake("torchvision::{name}") '
            f"if torchvision.extension._has_ops() else (lambda fn: fn))  {MARK}"
        )
        text = text.replace(decorator, conditional)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
