"""The `homing rollout` and `homing versions` admin verbs.

    homing rollout status MODEL | start MODEL VERSION [--steps 5,25,50,100] [--bake 10m]
        | pause MODEL | resume MODEL | promote MODEL | rollback MODEL
    homing versions set MODEL VERSION=WEIGHT... | reset MODEL

Every verb prints the model's rollout status afterwards (`--output json`: the
`RolloutStatus` message as data). Durations take a unit: "90s", "10m", "1h" (a bare number
is seconds).
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
from typing import TYPE_CHECKING, Any

from homing.admin.cli_support import EXIT_OK, Output, Verb, VerbMaker, message_dict
from homing.config.rules import MAX_BAKE_S, check_steps

if TYPE_CHECKING:
    from homing.v1 import admin_pb2 as pb

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(s|m|h)?\s*$", re.ASCII)
_NUMBER = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*$", re.ASCII)

_UNITS = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(value: str) -> float:
    """A bake time: "90s", "10m", "1h" or bare seconds, in 0..MAX_BAKE_S."""
    m = _DURATION.match(value)
    if m is None:
        raise argparse.ArgumentTypeError(f"{value[:40]!r} is not a duration (e.g. 90s, 10m, 1h)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds > MAX_BAKE_S:
        raise argparse.ArgumentTypeError(f"{value[:40]!r} is longer than {MAX_BAKE_S:g} s")
    return seconds


def steps(value: str) -> list[float]:
    """Canary weights "5,25,50,100" (percent; increasing, the last 100)."""
    try:
        parts = value.split(",")
        if not all(_NUMBER.match(part) for part in parts):
            raise ValueError("could not convert")
        return check_steps(float(part) for part in parts)
    except ValueError as err:
        shown = value[:60]
        if "could not convert" in str(err):
            raise argparse.ArgumentTypeError(
                f"{shown!r}: steps are numbers, e.g. 5,25,50,100"
            ) from None
        raise argparse.ArgumentTypeError(f"{shown!r}: {err}") from None


def weight_pair(value: str) -> tuple[str, float]:
    """One VERSION=WEIGHT of `versions set`."""
    version, sep, weight = value.rpartition("=")
    w = float(weight) if _NUMBER.match(weight) else math.nan
    if not sep or not version or not math.isfinite(w):
        raise argparse.ArgumentTypeError(
            f"{value[:60]!r} must look like VERSION=WEIGHT (e.g. v2=10)"
        )
    return version, w


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None, scale: float = 1e3) -> str:
    return "-" if value is None else f"{value * scale:.3g} ms"


def _span(seconds: float) -> str:
    """ "3m12s", "45s", "1h05m"."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _when(at: float) -> str:
    """Unix seconds as "2026-12-03 10:15:08" (UTC); the number itself when out of range."""
    try:
        return datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError, OSError):
        return f"{at:g}"


def _finish(f: dict[str, Any]) -> str:
    shares = sorted(f["finish_reasons"], key=lambda x: -x["share"])
    return ", ".join(f"{x['reason'] or '-'} {100 * x['share']:.0f}%" for x in shares) or "-"


def print_status(status: dict[str, Any], out: Output) -> None:
    """`rollout status` in words and tables (module docstring of the verbs)."""
    model = status["model"]
    split = status["split"]
    split_text = (
        ", ".join(f"{s['version'] or '(unlabelled)'} {s['weight']:g}" for s in split)
        if split
        else "none (every ready worker serves, whatever its version)"
    )
    if not status["has_rollout"]:
        out.line(f"{model}: no rollout")
        out.line(f"split: {split_text}")
        return
    phase = status["phase"].replace("_", " ")
    head = f"{model}: rollout of {status['canary']} against {status['baseline']}: {phase}"
    n = len(status["steps"])
    if status["phase"] == "running":
        head += (
            f", step {status['step'] + 1} of {n} ({status['weight']:g}%), baked "
            f"{_span(status['baked_s'])} of {_span(status['bake_s'])}"
        )
    elif status["phase"] == "paused":
        head += f" at step {status['step'] + 1} of {n} ({status['weight']:g}%)"
    else:
        head += f" (canary at {status['weight']:g}%)"
    out.line(head)
    if status["reason"]:
        out.line(f"reason: {status['reason']}")
    out.line(f"split: {split_text}")
    if status["verdict"]:
        out.line(f"verdict: {status['verdict']}: {status['verdict_reason']}")
    rows = []
    for role, f in (
        ("baseline", status["baseline_figures"]),
        ("canary", status["canary_figures"]),
    ):
        rows.append(
            [
                f["version"] or status[role],
                role,
                str(f["ready_workers"]),
                str(f["requests"]),
                _pct(f["error_rate"]),
                _pct(f["attainment"]),
                _ms(f["ttft_per_uncached_token_s"]),
                _ms(f["tpot_p50_s"]),
                "-" if f["output_tokens_mean"] is None else f"{f['output_tokens_mean']:.0f}",
                _finish(f),
            ]
        )
    out.table(
        [
            "VERSION",
            "ROLE",
            "READY",
            "REQUESTS",
            "ERRORS",
            "SLO-MET",
            "TTFT/UNCACHED-TOKEN",
            "TPOT-P50",
            "OUT-TOKENS",
            "FINISH",
        ],
        rows,
        title="this step's requests",
    )
    if status["checks"]:
        out.table(
            ["CHECK", "RESULT", "DETAIL"],
            [[c["name"], c["result"], c["detail"]] for c in status["checks"]],
        )
    out.table(
        ["AT", "EVENT", "WEIGHT", "REASON"],
        [
            [
                _when(e["at_unix_s"]),
                e["event"].replace("_", " "),
                f"{e['weight']:g}%",
                e["reason"],
            ]
            for e in status["history"]
        ],
        title="history (UTC)",
    )


def _show(response: pb.RolloutStatus, out: Output) -> int:
    data = message_dict(response)
    if out.mode == "json":
        out.json(data)
    else:
        print_status(data, out)
    return EXIT_OK


async def _status(admin: Any, args: argparse.Namespace, out: Output) -> int:
    return _show(await admin.get_rollout(args.model), out)


async def _start(admin: Any, args: argparse.Namespace, out: Output) -> int:
    return _show(await admin.start_rollout(args.model, args.version, args.steps, args.bake), out)


def _op(op: str) -> Verb:
    async def run(admin: Any, args: argparse.Namespace, out: Output) -> int:
        return _show(await admin.rollout_op(op, args.model), out)

    return run


async def _versions_set(admin: Any, args: argparse.Namespace, out: Output) -> int:
    weights: dict[str, float] = {}
    for version, weight in args.weights:
        if version in weights:
            raise SystemExit(f"homing: version {version!r} is given twice")
        weights[version] = weight
    return _show(await admin.set_versions(args.model, weights), out)


async def _versions_reset(admin: Any, args: argparse.Namespace, out: Output) -> int:
    return _show(await admin.set_versions(args.model, {}, reset=True), out)


def add_rollout_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], verb: VerbMaker
) -> None:
    """Add `rollout` and `versions` to the `homing` sub-commands (`verb` makes one verb's
    parser with the common admin options)."""
    rollout = sub.add_parser("rollout", help="roll a model version out: start, status, ...")
    rsub = rollout.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verb(rsub, "status", _status, "a model's split, rollout, comparison and verdict")
    p.add_argument("model", metavar="MODEL")
    p = verb(rsub, "start", _start, "roll VERSION out on MODEL step by step")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("version", metavar="VERSION", help="the canary: a version ready workers carry")
    p.add_argument(
        "--steps", type=steps, help="canary weights in percent, e.g. 5,25,50,100 (last 100)"
    )
    p.add_argument("--bake", type=duration, metavar="DURATION", help="per step, e.g. 10m")
    for name, text in (
        ("pause", "hold the rollout at its step"),
        ("resume", "go on from a pause (the step bakes again from now)"),
        ("promote", "give the canary 100%% now"),
        ("rollback", "give the canary 0%% now (its workers drained or kept)"),
    ):
        p = verb(rsub, name, _op(name), text)
        p.description = text.replace("%%", "%")  # argparse %-formats help, not descriptions
        p.add_argument("model", metavar="MODEL")
    versions = sub.add_parser("versions", help="set a model's version split by hand")
    vsub = versions.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verb(vsub, "set", _versions_set, "set the weights of a model's versions")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("weights", metavar="VERSION=WEIGHT", nargs="+", type=weight_pair)
    p = verb(vsub, "reset", _versions_reset, "return a model to its config's split")
    p.add_argument("model", metavar="MODEL")
