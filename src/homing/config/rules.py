"""The rules a configuration value and the live operations that change it share: version
labels and splits, worker URLs, rollout steps and bake times, local command templates and
SGLang model directories.

Rule of this file: a leaf (the standard library and pydantic only), so the config models
and every subsystem check a value with the same code and the same message.
"""

from __future__ import annotations

import itertools
import math
import re
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated

from pydantic import Field

# -- version labels --

#: The longest version label (characters).
MAX_VERSION_LABEL = 128
#: A version label's characters: printable ASCII, " " to "~".
VERSION_LABEL_PATTERN = r"^[ -~]*$"


def is_version_label(value: object) -> bool:
    """True when `value` is a version label: a string of at most MAX_VERSION_LABEL printable
    ASCII characters (empty: no label)."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_VERSION_LABEL
        and all(" " <= c <= "~" for c in value)
    )


def check_version_label(label: str) -> str:
    """`label` if it names a version (1-128 printable ASCII characters: a version label that
    is not empty); ValueError naming it otherwise."""
    if not label or not is_version_label(label):
        raise ValueError(
            f"a version label must be 1 to {MAX_VERSION_LABEL} printable ASCII characters, "
            f"got {label!r:.60}"
        )
    return label


#: A version label as a config field (`is_version_label`, pydantic's own messages).
VersionLabel = Annotated[str, Field(max_length=MAX_VERSION_LABEL, pattern=VERSION_LABEL_PATTERN)]

# -- version splits --

#: The largest and the smallest non-zero weight one version may be given (weights are
#: relative, percent in practice; below MIN_WEIGHT the score -ln(u)/w of
#: `homing.router.versions` overflows to inf).
MAX_WEIGHT = 1_000_000.0
MIN_WEIGHT = 1e-6

#: The most versions one split may name.
MAX_VERSIONS = 64


def check_version_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """`weights` (version label -> weight) as floats if they are a split's: at most
    MAX_VERSIONS versions, each weight 0 or in [MIN_WEIGHT, MAX_WEIGHT], at least one
    above 0; ValueError saying what is wrong."""
    if len(weights) > MAX_VERSIONS:
        raise ValueError(f"a split names at most {MAX_VERSIONS} versions, got {len(weights)}")
    checked: dict[str, float] = {}
    for version, weight in weights.items():
        w = float(weight)
        if not math.isfinite(w) or w < 0 or w > MAX_WEIGHT or 0 < w < MIN_WEIGHT:
            raise ValueError(
                f"the weight of version {version!r} must be 0 or in [{MIN_WEIGHT:g}, "
                f"{MAX_WEIGHT:g}], got {weight!r}"
            )
        checked[version] = w
    if not any(w > 0 for w in checked.values()):
        raise ValueError("at least one version needs a weight above 0")
    return checked


# -- worker URLs --

#: Longest worker URL accepted (characters); a host name is at most 253 (RFC 1035).
MAX_WORKER_URL = 300
_HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
_IPV6 = re.compile(r"^\[[0-9A-Fa-f:.]+\]$")


def check_worker_url(url: str) -> str:
    """The canonical form of a worker URL `grpc://host:port`: host lower-cased, `localhost`
    as 127.0.0.1, the port without leading zeros (so one engine has one URL). The host is a
    DNS name, an IPv4 address or a bracketed IPv6 address; the port ASCII digits in
    1..65535. ValueError saying what is wrong otherwise (the URL shown cut to 64 chars)."""
    shown = url if len(url) <= 64 else url[:64] + "..."
    if len(url) > MAX_WORKER_URL:
        raise ValueError(f"worker URL {shown!r} is longer than {MAX_WORKER_URL} characters")
    rest = url.removeprefix("grpc://")
    host, _, port = rest.rpartition(":")
    if not url.startswith("grpc://") or not host or not port:
        raise ValueError(f"worker URL {shown!r} must look like grpc://host:port")
    if "/" in port:
        raise ValueError(f"worker URL {shown!r} must end at its port (grpc://host:port, no path)")
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"worker URL {shown!r} needs a port in 1-65535")
    if not (_HOST_NAME.fullmatch(host) or _IPV6.fullmatch(host)):
        raise ValueError(
            f"worker URL {shown!r} has an invalid host (a DNS name, an IPv4 address or "
            "[IPv6] expected)"
        )
    host = host.lower()
    if host == "localhost":
        host = "127.0.0.1"
    return f"grpc://{host}:{int(port)}"


# -- rollouts --

#: Most steps a rollout plan may have.
MAX_STEPS = 100

#: The longest bake of a rollout step (seconds): a week.
MAX_BAKE_S = 7 * 86400


def check_steps(steps: Iterable[float], *, need_baseline: bool = True) -> list[float]:
    """`steps` as floats if they are a rollout's canary weights: percents in (0, 100],
    strictly increasing, the last 100 with (when `need_baseline`: a new plan) at least one
    before it, at most MAX_STEPS; ValueError saying what is wrong."""
    out = [float(s) for s in steps]
    if not out:
        raise ValueError("a rollout needs at least one step (the last is 100)")
    if len(out) > MAX_STEPS:
        raise ValueError(f"a rollout has at most {MAX_STEPS} steps, got {len(out)}")
    for s in out:
        if not math.isfinite(s) or not 0 < s <= 100:
            raise ValueError(f"each step is a percent in (0, 100], got {s:g}")
    if any(b <= a for a, b in itertools.pairwise(out)):
        raise ValueError("the steps must increase (e.g. 5,25,50,100)")
    if out[-1] != 100:
        raise ValueError(f"the last step must be 100 (it promotes the canary), got {out[-1]:g}")
    if need_baseline and len(out) < 2:
        raise ValueError(
            "a rollout needs a step below 100 (at 100 no baseline traffic is left to compare "
            "with; use homing rollout promote to skip the comparison)"
        )
    return out


# -- local command templates --

#: Placeholders a local actuator's command template may use.
PLACEHOLDERS = frozenset({"port", "host", "model", "index"})
#: What the placeholders are filled in with to check that a template can be.
_SAMPLE_VALUES = {"port": 1, "host": "127.0.0.1", "model": "model", "index": 0}


def check_command_template(argv: list[str], env: Mapping[str, str] | None = None) -> None:
    """Raise ValueError unless `argv` (and `env`'s values) are a command template that can
    be filled in: a program to run, no placeholder but PLACEHOLDERS, no format spec or
    conversion that fails on filling in; `{{` and `}}` are literal braces."""
    if not argv or not argv[0]:
        raise ValueError("command template: argv is empty (it needs a program to run)")
    texts = [*(("argv", a) for a in argv), *((f"env {k}", v) for k, v in (env or {}).items())]
    for where, text in texts:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
        except ValueError as err:
            raise ValueError(f"command template: {where} {text!r}: {err}") from None
        for name in fields:
            if name not in PLACEHOLDERS:
                raise ValueError(
                    f"command template: {where} {text!r} has unknown placeholder "
                    f"{{{name}}}; known: {', '.join(sorted(PLACEHOLDERS))}"
                )
    try:  # a format spec or conversion (`{port:zz}`, `{port!z}`) fails only on filling in
        for _, text in texts:
            text.format(**_SAMPLE_VALUES)
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as err:
        raise ValueError(f"command template: cannot be filled in: {err}") from None


# -- SGLang model directories --


def check_model_dir(path: str) -> None:
    """Raise ValueError unless `path` is a directory holding a `config.json` (a model SGLang
    can load)."""
    model = Path(path)
    if not model.exists():
        raise ValueError(f"model directory {path} does not exist")
    if not model.is_dir():
        raise ValueError(f"model path {path} is not a directory")
    if not (model / "config.json").is_file():
        raise ValueError(f"model directory {path} has no config.json")
