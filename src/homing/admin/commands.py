"""The `homing` admin verbs, clients of a running gateway's admin API.

    homing workers ls [--model M] | add MODEL URL [--version V] | drain ID [--wait]
        [--timeout S] [--grace S] | cordon ID | uncordon ID | rm ID [--force]
    homing models ls | homing tenants ls | homing stats
    homing scaler status [--model M] | advise [--model M]
    homing rollout ... | homing versions ... (homing.admin.rollout_commands)

Each takes `--admin ADDR` (default `$HOMING_ADMIN`, else the default socket), `--admin-key
KEY` (default `$HOMING_ADMIN_KEY`) and `--output table|json` (default: table on a terminal,
json otherwise). Data goes to stdout, diagnostics (`homing: <message>`) to stderr.
`scaler status` and `scaler advise` with no autoscaled model (or `--model` one that is not
autoscaled) say so in one `homing: ...` line on stderr and exit 0 (with `--output json` the
empty `pools` list still goes to stdout). Exit status (`EXIT_*`): 0 done; 1 refused (the
server said no, or `drain --wait` timed out); 2 usage (argparse); 3 unreachable (no socket,
nothing answering).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

from homing.admin.cli_support import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Output,
    Verb,
    message_dict,
)
from homing.admin.rollout_commands import add_rollout_commands

if TYPE_CHECKING:
    from homing.v1 import admin_pb2 as pb


def _opt(value: Any, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


WORKER_HEADERS = [
    "ID",
    "MODEL",
    "URL",
    "VERSION",
    "PHASE",
    "HEALTHY",
    "BREAKER",
    "IN-FLIGHT",
    "RUNNING",
    "WAITING",
    "KV",
    "BLOCKS",
    "KV-STREAM",
    "LAST ERROR",
]


def _worker_row(w: dict[str, Any]) -> list[str]:
    """One `workers` table row: BREAKER is closed, open or half-open ("-" from a server
    that does not report it); an outlier-ejected worker shows PHASE "ejected"."""
    return [
        w["id"],
        w["model"],
        w["url"],
        w["version"] or "-",
        w["phase"],
        "yes" if w["healthy"] else "no",
        (w.get("breaker") or "-").replace("_", "-"),
        str(w["in_flight"]),
        _opt(w["running"]),
        _opt(w["waiting"]),
        _opt(None if w["token_usage"] is None else 100 * w["token_usage"], "{:.0f}%"),
        str(w["cached_blocks"]),
        w["kv_stream"],
        w["last_error"] or "-",
    ]


def _show_workers(out: Output, workers: list[dict[str, Any]], data: Any) -> None:
    if out.mode == "json":
        out.json(data)
    else:
        out.table(WORKER_HEADERS, [_worker_row(w) for w in workers])


async def _workers_ls(admin: Any, args: argparse.Namespace, out: Output) -> int:
    response = message_dict(await admin.list_workers(args.model or ""))
    _show_workers(out, response["workers"], response)
    return EXIT_OK


async def _workers_add(admin: Any, args: argparse.Namespace, out: Output) -> int:
    worker = message_dict(await admin.add_worker(args.model, args.url, args.version))
    _show_workers(out, [worker], worker)
    return EXIT_OK


async def _workers_drain(admin: Any, args: argparse.Namespace, out: Output) -> int:
    response = message_dict(
        await admin.drain_worker(
            args.id, wait=args.wait, timeout_s=args.timeout, grace_s=args.grace
        )
    )
    worker = response["worker"]
    if args.wait and not response["left"]:
        waited = "" if args.timeout is None else f" after {args.timeout:g} s"
        print(
            f"homing: worker {args.id} has not left{waited} "
            f"({worker['in_flight']} request(s) still in flight); it is still draining and "
            "leaves when they end, or when they are cut at the drain timeout",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    _show_workers(out, [worker], response)
    return EXIT_OK


async def _workers_cordon(admin: Any, args: argparse.Namespace, out: Output) -> int:
    worker = message_dict(await admin.cordon_worker(args.id))
    _show_workers(out, [worker], worker)
    return EXIT_OK


async def _workers_uncordon(admin: Any, args: argparse.Namespace, out: Output) -> int:
    worker = message_dict(await admin.uncordon_worker(args.id))
    _show_workers(out, [worker], worker)
    return EXIT_OK


async def _workers_rm(admin: Any, args: argparse.Namespace, out: Output) -> int:
    worker = message_dict(await admin.remove_worker(args.id, force=args.force))
    _show_workers(out, [worker], worker)
    return EXIT_OK


async def _models_ls(admin: Any, args: argparse.Namespace, out: Output) -> int:
    response = message_dict(await admin.list_models())
    if out.mode == "json":
        out.json(response)
        return EXIT_OK
    rows = [
        [
            m["name"],
            m["policy"],
            str(m["ready_workers"]),
            str(m["workers"]),
            str(m["max_context_length"]),
        ]
        for m in response["models"]
    ]
    out.table(["NAME", "POLICY", "READY", "WORKERS", "CONTEXT"], rows)
    return EXIT_OK


def _quota_cells(limits: dict[str, Any], use: dict[str, Any]) -> list[str]:
    """`used/limit` per kind (requests, tokens, streams); "-" where unlimited."""
    cells = []
    for limit_name, use_name in (
        ("requests_per_minute", "requests"),
        ("tokens_per_minute", "tokens"),
        ("concurrent_streams", "streams"),
    ):
        limit, used = limits[limit_name], use[use_name]
        cells.append("-" if limit is None else f"{_opt(used)}/{limit}")
    return cells


async def _tenants_ls(admin: Any, args: argparse.Namespace, out: Output) -> int:
    response = message_dict(await admin.list_tenants())
    if out.mode == "json":
        out.json(response)
        return EXIT_OK
    rows = []
    for t in response["tenants"]:
        models = "all" if t["any_model"] else ", ".join(t["models"]) or "none"
        rows.append([t["name"], str(t["priority"]), models, *_quota_cells(t["limits"], t["use"])])
        for k in t["keys"]:
            key_models = ", ".join(k["models"]) or "none" if k["narrowed"] else ""
            name = f"  key {k['id']}" + (" (disabled)" if k["disabled"] else "")
            rows.append([name, "", key_models, *_quota_cells(k["limits"], k["use"])])
    window = response["window_s"]
    title = f"use/limit per {window:g} s window ({response['backend']} store)" if window else None
    out.table(["TENANT", "PRIORITY", "MODELS", "REQUESTS", "TOKENS", "STREAMS"], rows, title)
    if response["use_error"]:
        print(f"homing: live use unavailable: {response['use_error']}", file=sys.stderr)
    return EXIT_OK


async def _stats(admin: Any, args: argparse.Namespace, out: Output) -> int:
    response = message_dict(await admin.get_stats())
    if out.mode == "json":
        out.json(response)
        return EXIT_OK
    out.table(
        ["UPTIME", "IN-FLIGHT", "VERSION"],
        [[f"{response['uptime_s']:.0f} s", str(response["in_flight"]), response["version"]]],
    )
    rows = [
        [m["name"], str(m["ready_workers"]), str(m["workers"]), str(m["in_flight"])]
        for m in response["models"]
    ]
    out.table(["MODEL", "READY", "WORKERS", "IN-FLIGHT"], rows)
    return EXIT_OK


def scaler_dict(response: pb.GetScalerResponse) -> dict[str, Any]:
    """A `GetScalerResponse` as `message_dict` data, with a pool's `last` and `advice`, and
    a decision's `signals`, None when unset (before the first tick; without `advise`)."""
    data = message_dict(response)
    for pool, message in zip(data["pools"], response.pools, strict=True):
        for name in ("last", "advice"):
            if not message.HasField(name):
                pool[name] = None
            elif not getattr(message, name).HasField("signals"):
                pool[name]["signals"] = None
    return data


SCALER_HEADERS = [
    "MODEL",
    "MODE",
    "ACTUATOR",
    "READY",
    "WARM",
    "STARTING",
    "DRAINING",
    "DESIRED-READY",
    "DESIRED-WARM",
    "REPLICAS",
    "REASON",
    "HELD-BY",
    "COLD-START",
    "CAPACITY",
]


def _figure(value: float) -> str:
    """A chain step or a rate in at most 4 significant digits ("2.5", "1e+09")."""
    return f"{value:.4g}"


def _cold_start(pool: dict[str, Any]) -> str:
    """The measured cold start, else the policy's assumed default, marked as such."""
    if pool["cold_start_s"] is not None:
        return f"{pool['cold_start_s']:.1f} s"
    return f"{pool['default_cold_start_s']:g} s (default)"


def _capacity(pool: dict[str, Any]) -> str:
    """Per replica: decode streams within the TPOT SLO and prefill tokens/s."""
    return (
        f"{_figure(pool['decode_streams_per_replica'])} streams, "
        f"{_figure(pool['prefill_tokens_per_s_per_replica'])} prefill tok/s"
    )


def _scaler_row(pool: dict[str, Any]) -> list[str]:
    """One `scaler status` row; the DESIRED, REASON and HELD-BY cells are "-" before the
    first tick."""
    last = pool["last"]
    return [
        pool["model"],
        pool["mode"],
        pool["actuator"],
        str(pool["ready"]),
        str(pool["warm"]),
        str(pool["starting"]),
        str(pool["draining"]),
        "-" if last is None else str(last["desired_ready"]),
        "-" if last is None else str(last["desired_warm"]),
        f"{pool['min_replicas']}..{pool['max_replicas']}",
        "-" if last is None else last["reason"],
        "-" if last is None else last["held_by"] or "-",
        _cold_start(pool),
        _capacity(pool),
    ]


def _not_autoscaled(model: str | None) -> str:
    if model:
        return f"model {model} is not autoscaled (its [scaler] is not enabled)"
    return "no model is autoscaled (enable it with [scaler] enabled = true)"


async def _scaler_status(admin: Any, args: argparse.Namespace, out: Output) -> int:
    response = scaler_dict(await admin.get_scaler(args.model or ""))
    if out.mode == "json":
        out.json(response)
    elif response["pools"]:
        out.table(SCALER_HEADERS, [_scaler_row(p) for p in response["pools"]])
    if not response["pools"]:
        print(f"homing: {_not_autoscaled(args.model)}", file=sys.stderr)
    return EXIT_OK


def _decided(d: dict[str, Any]) -> str:
    """ "ready 3 warm 0 (scale_up, held by window, fast)": a decision in words."""
    notes = [d["reason"]]
    if d["held_by"]:
        notes.append(f"held by {d['held_by']}")
    if d["fast"]:
        notes.append("fast path")
    return f"ready {d['desired_ready']} warm {d['desired_warm']} ({', '.join(notes)})"


def _signals_line(s: dict[str, Any]) -> str:
    """The signals a decision was made from, in one line ("-" where there is no data)."""
    return (
        f"from: ready {s['ready']} warm {s['warm']} starting {s['starting']} "
        f"draining {s['draining']}, {s['in_flight']} in flight, {s['queued']} queued, "
        f"{_figure(s['arrivals_per_s'])} req/s, {_figure(s['prefill_tokens_per_s'])} prefill "
        f"tok/s, ttft p95 {_opt(s['ttft_p95_s'], '{:.3f} s')} (slo "
        f"{_opt(s['ttft_slo_s'], '{:g} s')}), burn rate {_opt(s['burn_rate'], '{:.2f}')}"
    )


#: The line `scaler advise` ends with (table output).
ADVISE_UNCHANGED = (
    "nothing was changed: this is what a tick would decide now; the scaler acts only at its "
    "own ticks"
)


async def _scaler_advise(admin: Any, args: argparse.Namespace, out: Output) -> int:
    response = scaler_dict(await admin.get_scaler(args.model or "", advise=True))
    pools = response["pools"]
    if out.mode == "json":
        out.json(response)
    for pool in pools if out.mode == "table" else ():
        advice = pool["advice"]
        out.line(
            f"{pool['model']} ({pool['mode']}, {pool['actuator']} actuator, replicas "
            f"{pool['min_replicas']}..{pool['max_replicas']}): would decide {_decided(advice)}"
        )
        steps = [[c["name"], _figure(c["value"])] for c in advice["chain"]]
        out.table(["STEP", "VALUE"], steps)
        if advice["signals"] is not None:
            out.line(_signals_line(advice["signals"]))
        out.line("last tick: " + ("none yet" if pool["last"] is None else _decided(pool["last"])))
    if not pools:
        print(f"homing: {_not_autoscaled(args.model)}", file=sys.stderr)
    elif out.mode == "table":
        out.line(ADVISE_UNCHANGED)
    return EXIT_OK


def add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `workers`, `models`, `tenants`, `stats`, `scaler`, `rollout` and `versions` to
    the `homing` sub-commands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin",
        metavar="ADDR",
        help="admin API address, unix:PATH or HOST:PORT (default $HOMING_ADMIN, else "
        "unix:<state dir>/admin.sock)",
    )
    common.add_argument("--admin-key", metavar="KEY", help="admin key (default $HOMING_ADMIN_KEY)")
    common.add_argument(
        "--output",
        choices=["table", "json"],
        help="table (default when stdout is a terminal) or json (default otherwise)",
    )

    def verb(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        fn: Verb,
        help_text: str,
    ) -> argparse.ArgumentParser:
        p = parent.add_parser(name, parents=[common], help=help_text, description=help_text)
        p.set_defaults(admin_verb=fn)
        return p

    workers = sub.add_parser("workers", help="list, add, drain, cordon and remove workers")
    wsub = workers.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verb(wsub, "ls", _workers_ls, "list the workers of every model (or one)")
    p.add_argument("--model", help="only this model's workers")
    p = verb(wsub, "add", _workers_add, "add a worker to a model's pool")
    p.add_argument("model", metavar="MODEL", help="the served model name")
    p.add_argument("url", metavar="URL", help="the worker, grpc://HOST:PORT")
    p.add_argument("--version", default="", help="a label of its engine or weights revision")
    p = verb(wsub, "drain", _workers_drain, "stop new requests to a worker; it leaves when idle")
    p.add_argument("id", metavar="ID", help="worker id (see workers ls)")
    p.add_argument("--wait", action="store_true", help="return once the worker has left")
    p.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help="with --wait: give up after S seconds (exit 1; the worker keeps draining)",
    )
    p.add_argument(
        "--grace",
        type=_seconds,
        metavar="S",
        help="seconds its requests get before they are cut (default: gateway.drain_timeout_s)",
    )
    p = verb(wsub, "cordon", _workers_cordon, "stop new requests to a ready worker; it stays")
    p.add_argument("id", metavar="ID", help="worker id")
    p = verb(wsub, "uncordon", _workers_uncordon, "let a cordoned worker take requests again")
    p.add_argument("id", metavar="ID", help="worker id")
    p = verb(wsub, "rm", _workers_rm, "remove a worker now")
    p.add_argument("id", metavar="ID", help="worker id")
    p.add_argument("--force", action="store_true", help="cut its requests in flight")

    models = sub.add_parser("models", help="list the served models and their pools")
    verb(models.add_subparsers(dest="verb", required=True, metavar="VERB"), "ls", _models_ls,
         "list the served models with their pools")  # fmt: skip
    tenants = sub.add_parser("tenants", help="list the tenants and their quota use")
    verb(tenants.add_subparsers(dest="verb", required=True, metavar="VERB"), "ls", _tenants_ls,
         "list the tenants with their limits and live quota use")  # fmt: skip
    stats = sub.add_parser(
        "stats", parents=[common], help="uptime, requests in flight, workers per model"
    )
    stats.set_defaults(admin_verb=_stats)
    scaler = sub.add_parser("scaler", help="the autoscaler's state and advice")
    ssub = scaler.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verb(ssub, "status", _scaler_status, "each autoscaled pool: replicas, its last decision")
    p.add_argument("--model", help="only this model's pool")
    p = verb(
        ssub, "advise", _scaler_advise, "what the autoscaler would decide now (changes nothing)"
    )
    p.add_argument("--model", help="only this model's pool")

    add_rollout_commands(sub, verb)


#: Longest wait a command may ask for (seconds): a day.
MAX_SECONDS = 86_400.0


def _seconds(value: str) -> float:
    """A duration argument: a finite number of seconds in 0..MAX_SECONDS."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= seconds <= MAX_SECONDS:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value!r} must be between 0 and {MAX_SECONDS:g} s")
    return seconds


def run_admin(args: argparse.Namespace) -> int:
    """Run the admin verb `args` names (`admin_verb`); the exit status."""
    from homing.admin.client import AdminClient, AdminError, resolve_address

    mode = args.output or ("table" if sys.stdout.isatty() else "json")
    if getattr(args, "timeout", None) is not None and not args.wait:
        print("homing: --timeout needs --wait", file=sys.stderr)
        return EXIT_USAGE
    try:
        address = resolve_address(args.admin)
    except ValueError as err:
        print(f"homing: {err}", file=sys.stderr)
        return EXIT_USAGE
    key = args.admin_key if args.admin_key is not None else os.environ.get("HOMING_ADMIN_KEY")
    if key is not None and not (key.isascii() and key.isprintable() and " " not in key):
        print("homing: the admin key must be printable ASCII without spaces", file=sys.stderr)
        return EXIT_USAGE

    async def call() -> int:
        async with AdminClient(address, key=args.admin_key) as admin:
            fn: Verb = args.admin_verb
            return await fn(admin, args, Output(mode))

    try:
        return asyncio.run(call())
    except AdminError as err:
        print(f"homing: {err.message}", file=sys.stderr)
        return EXIT_UNREACHABLE if err.unreachable else EXIT_REFUSED
    except KeyboardInterrupt:
        return 130
