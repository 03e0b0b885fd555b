"""One binary: `homing serve | sim | worker | bench | plan`, the admin verbs and completion.

`homing serve` with no `--config` runs the embedded default (simulated SGLang workers as
child processes, the gateway on 127.0.0.1:8080 and gRPC on 127.0.0.1:50051, the admin API on
its Unix socket); with `--engine sglang --model PATH` the child processes are real SGLang
workers. `homing sim` runs simulated workers in this process; `homing worker` runs one real
SGLang worker; `homing bench` replays a trace against a running gateway; `homing plan` prints
the sizing chain (`homing.plan`).
`homing workers | models | tenants | stats` talk to a running gateway's admin API
(`homing.admin.commands`); `homing top` is a live view of its `/metrics` (`homing.top`);
`homing completion bash|zsh` prints a completion script.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from homing import __version__

if TYPE_CHECKING:
    from homing.config import HomingConfig


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the gateway, router and (by default) simulated workers")
    p.add_argument("--config", help="TOML config file (default: the embedded default)")
    p.add_argument("--host", help="HTTP listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default 8080)")
    p.add_argument("--grpc-port", type=int, help="gRPC API port (default 50051)")
    p.add_argument(
        "--policy",
        choices=["cache_aware", "round_robin", "least_load", "consistent_hash"],
        help="routing policy for the served model (default cache_aware)",
    )
    p.add_argument(
        "--worker",
        action="append",
        dest="workers",
        metavar="grpc://HOST:PORT",
        help="serve this SGLang worker (repeatable); disables the simulated ones",
    )
    p.add_argument(
        "--engine",
        choices=["sim", "sglang"],
        help="workers homing starts when none is listed: simulated (default) or real SGLang",
    )
    p.add_argument(
        "--workers",
        type=int,
        dest="launch_workers",
        metavar="N",
        help="number of workers homing starts, of either engine (default 2)",
    )
    p.add_argument("--sim-workers", type=int, help="number of simulated workers (default 2)")
    p.add_argument(
        "--sim-model",
        action="append",
        dest="sim_models",
        metavar="PRESET=N",
        help="serve this simulated model on N workers (repeatable: several models at once; "
        "e.g. --sim-model llama-3.1-8b=2 --sim-model llama-3.1-70b=2)",
    )
    p.add_argument(
        "--model",
        help="simulated model preset (default llama-3.1-8b); with --engine sglang, "
        "the model directory SGLang loads",
    )
    p.add_argument("--gpu", help="simulated GPU (default H100)")
    p.add_argument(
        "--tp",
        type=int,
        help="tensor-parallel size (simulated: default the preset's; sglang: default 1)",
    )
    p.add_argument("--speedup", type=float, help="simulated clock speedup (default 1.0)")
    p.add_argument(
        "--processes",
        type=_processes,
        metavar="N|auto",
        help="gateway processes sharing the listeners (default 1; auto: one per usable CPU)",
    )
    p.add_argument("--follower", metavar="PLAN", help=argparse.SUPPRESS)  # see app.processes
    p.add_argument("--log-level", default="info")


def _processes(value: str) -> int | str:
    """`--processes`: "auto" or a whole number (the config checks its range)."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:64]!r} is neither a number nor auto") from None


def _serve_config(args: argparse.Namespace) -> HomingConfig:
    """The configuration `homing serve` runs: the file (or the embedded default) with the
    command line's overrides. Raises `ConfigError` with the first problem found."""
    from pydantic import ValidationError

    from homing.config import ConfigError, load_config

    config = load_config(args.config)
    if args.engine is not None:
        config.engines.launch = args.engine
    sglang = config.engines.launch == "sglang"
    overrides = [
        (config.gateway, "host", args.host),
        (config.gateway, "port", args.port),
        (config.gateway, "grpc_port", args.grpc_port),
        (config.gateway, "processes", args.processes),
        (config.router, "policy", args.policy),
        (config.sim, "workers", args.sim_workers),
        (config.sglang if sglang else config.sim, "workers", args.launch_workers),
        (config.sglang, "model_path", args.model) if sglang else (config.sim, "model", args.model),
        (config.sim, "gpu", args.gpu),
        (config.sglang if sglang else config.sim, "tp", args.tp),
        (config.sim, "speedup", args.speedup),
    ]
    for section, name, value in overrides:
        if value is not None:
            setattr(section, name, value)
    if args.workers:
        config.engines.workers = list(args.workers)
    if args.sim_models:
        try:
            config.models = [_sim_model(config, value) for value in args.sim_models]
        except ValueError as err:
            raise ConfigError(f"invalid option: --sim-model: {err}") from None
    try:
        return type(config).model_validate(config.model_dump())  # re-check the overrides
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(
            f"invalid option: {where + ': ' if where else ''}"
            f"{first['msg'].removeprefix('Value error, ')}"
        ) from None


def _serve(args: argparse.Namespace) -> int:
    """Run `homing serve`: 0 after a stop signal, 2 for a configuration or socket-activation
    error, 1 when the start failed; each error printed as "homing: <message>"."""
    from homing.config import ConfigError
    from homing.daemon.activation import ActivationError
    from homing.daemon.runner import Daemon
    from homing.obs.logging import configure_logging
    from homing.scaler.actuators.base import ActuatorError

    configure_logging(args.log_level)
    if args.follower is not None:
        return _follow(args.follower)
    try:
        config = _serve_config(args)
    except ConfigError as err:
        print(f"homing: {error_message(err)}", file=sys.stderr)
        return 2

    if config.gateway.process_count() > 1:  # each process's log lines say which it is
        import structlog

        structlog.contextvars.bind_contextvars(process=0)
    try:
        _run(Daemon(config, lambda: _serve_config(args)).run())
    except ActivationError as err:
        print(f"homing: {error_message(err)}", file=sys.stderr)
        return 2
    except ActuatorError as err:  # the autoscaler could not start its first replicas
        print(f"homing: autoscaler: {error_message(err)}", file=sys.stderr)
        return 1
    except (RuntimeError, TimeoutError) as err:  # a worker that did not start
        print(f"homing: {error_message(err)}", file=sys.stderr)
        return 1
    except OSError as err:  # after TimeoutError, which is one
        print(f"homing: {err.strerror or error_message(err)}", file=sys.stderr)
        return 1
    return 0


def _follow(plan_file: str) -> int:
    """Run one follower of a `homing serve` with several processes, as its plan file says
    (`homing.app.processes`): 0 after a stop signal, 1 when it could not start."""
    import socket
    from pathlib import Path

    import structlog

    from homing.app.processes import FollowerPlan
    from homing.daemon.runner import Daemon
    from homing.engines.pool.shared_in_flight import InFlightBoard

    path = Path(plan_file)
    try:
        plan = FollowerPlan.read(path)
        structlog.contextvars.bind_contextvars(process=plan.index)
        http = socket.socket(fileno=plan.http_fd)
        board = InFlightBoard.open(plan.leader.board) if plan.leader.board else None
        daemon = Daemon(
            plan.config,
            lambda: FollowerPlan.read(path).config,
            follow=plan.leader,
            sockets={"http": http},
            shared_in_flight=(board, plan.index) if board is not None else None,
        )
        _run(daemon.run())
    except (OSError, ValueError, RuntimeError, TimeoutError) as err:
        print(f"homing: gateway process: {error_message(err)}", file=sys.stderr)
        return 1
    return 0


def error_message(err: BaseException) -> str:
    """`str(err)`, or the exception's type name when that is empty: never an empty line."""
    return str(err) or type(err).__name__


def _sim_model(config: object, value: str) -> object:
    """A `[[models]]` entry for `--sim-model PRESET=N` (N simulated workers of the preset,
    with the other simulator settings of `config.sim`); ValueError on a malformed value."""
    from homing.config import HomingConfig, ModelSettings
    from homing.sim.timing import MODELS

    assert isinstance(config, HomingConfig)
    name, sep, count = value.partition("=")
    shown = repr(value if len(value) <= 64 else value[:64] + "...")
    if not name or (sep and not (count.isascii() and count.isdigit())):
        raise ValueError(f"{shown} must look like PRESET or PRESET=N (N workers)")
    if name not in MODELS:
        raise ValueError(f"unknown preset {name[:64]!r}; known: {', '.join(sorted(MODELS))}")
    workers = int(count) if sep else config.sim.workers
    if not 1 <= workers <= 64:
        raise ValueError(f"{shown}: N must be 1 to 64 workers")
    sim = config.sim.model_copy(update={"model": name, "workers": workers})
    return ModelSettings(name=name, sim=sim)


def _run(coro: object) -> None:
    import uvloop

    uvloop.run(coro)  # type: ignore[arg-type]


def _parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[Any]]:
    parser = argparse.ArgumentParser(prog="homing", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"homing {__version__}")
    return parser, parser.add_subparsers(dest="command", required=True)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the `homing` binary. `only`: a sub-command (not `completion`,
    which describes them all) whose parser alone is built, the same as the whole parser's
    for it, so that starting it imports nothing for the others; None or another name: every
    sub-command."""
    parser, sub = _parser()
    adders: dict[str, Callable[[argparse._SubParsersAction[Any]], None]] = {
        "serve": _add_serve,
        "sim": _add_sim,
        "worker": _add_worker,
        "bench": _add_bench,
        "plan": _add_plan,
    }
    if only in adders:
        adders[only](sub)
        return parser
    from homing.admin.commands import add_admin_commands

    for add in adders.values():
        add(sub)
    add_admin_commands(sub)
    _add_top(sub)
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for SHELL; e.g. for bash: "
        "homing completion bash > ~/.local/share/bash-completion/completions/homing",
    )
    completion.add_argument("shell", choices=["bash", "zsh"], metavar="SHELL", help="bash or zsh")
    return parser


def _add_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from homing.sim.main import add_sim_arguments

    add_sim_arguments(sub.add_parser("sim", help="run simulated SGLang workers"))


def _add_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from homing.engines.worker_main import add_worker_arguments

    add_worker_arguments(sub.add_parser("worker", help="run one real SGLang worker"))


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from homing.bench.main import add_bench_arguments

    add_bench_arguments(sub.add_parser("bench", help="replay a trace against a gateway"))


def _add_plan(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from homing.plan.main import DESCRIPTION, add_plan_arguments

    add_plan_arguments(
        sub.add_parser("plan", help="size a fleet: replicas, GPUs, cost", description=DESCRIPTION)
    )


def _add_top(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from homing.top.main import add_top_arguments

    text = "live view of a running gateway's models and workers, from its /metrics"
    add_top_arguments(sub.add_parser("top", help=text, description=text))


#: Sub-commands parsed by `admin_parser`: clients of a running gateway.
ADMIN_COMMANDS = frozenset(
    {"workers", "models", "tenants", "stats", "scaler", "rollout", "versions", "top"}
)


def admin_parser() -> argparse.ArgumentParser:
    """The parser of the admin verbs alone, the same as `build_parser`'s for them: it does
    not import the sim, worker and bench modules, which would add about a second to every
    admin command's start."""
    from homing.admin.commands import add_admin_commands

    parser, sub = _parser()
    add_admin_commands(sub)
    _add_top(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `homing` console script; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first == "serve":  # a SIGHUP during the imports to come is a reload, not the end
        from homing.daemon.early import hold_sighup

        hold_sighup()
    # A sub-command's own parser only when it comes first: its usage and errors are then
    # the same as the whole parser's (`homing -h serve` lists every sub-command).
    own = first if args_list[:1] == [first] else None
    parser = admin_parser() if first in ADMIN_COMMANDS else build_parser(own)
    args = parser.parse_args(args_list)
    if getattr(args, "admin_verb", None) is not None:
        from homing.admin.commands import run_admin

        return run_admin(args)
    if args.command == "completion":
        import shtab

        print(shtab.complete(parser, shell=args.shell), end="")
        return 0
    if args.command == "serve":
        return _serve(args)
    if args.command == "top":
        from homing.top.main import run_top

        return run_top(args)
    if args.command == "sim":
        from homing.sim.main import run_sim

        return run_sim(args)
    if args.command == "worker":
        from homing.engines.worker_main import run_worker

        try:
            return run_worker(args)
        except KeyboardInterrupt:  # Ctrl-C before its signal handlers are set
            return 130
    if args.command == "bench":
        from homing.bench.main import run_bench

        return run_bench(args)
    if args.command == "plan":
        from homing.plan.main import run_plan

        return run_plan(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
