"""Several gateway processes on one box (`gateway.processes`): what a follower runs.

Rule of the file: pure translation of the leader's configuration into a follower's, and the
plan file that carries it to the follower's process. The leader (process 0) is the whole
`homing serve`: it launches the workers, owns the admin API, the autoscaler and the
rollouts. A follower serves the same listeners (the inherited HTTP socket, the gRPC port
on SO_REUSEPORT) with its own router, index and pools over the leader's workers, whose
membership it mirrors from the leader's admin API (`homing.fleet.mirror`); it launches
nothing, scales nothing and answers admin calls on a private socket only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from homing.config import AdminKeySettings, HomingConfig
from homing.config.engines import WorkerEntry
from homing.config.scaler import ScalerSettings


@dataclass(frozen=True)
class Leader:
    """What a follower reaches of its leader: the admin API at `admin` ("unix:PATH") with
    `key` (None: it has no keys), the quota store's socket `quotas` (None: the quotas are
    not the leader's memory backend), and the in-flight board's file `board`."""

    admin: str
    key: str | None = None
    quotas: str | None = None
    board: str | None = None


@dataclass(frozen=True)
class FollowerPlan:
    """What follower `index` (1..N-1; the leader is 0) runs: `config`, the HTTP listening
    socket inherited as descriptor `http_fd`, and its `leader`, whose workers it mirrors."""

    index: int
    leader: Leader
    http_fd: int
    config: HomingConfig

    def write(self, path: Path) -> None:
        """Write the plan as JSON to `path`, atomically (a reload rewrites it in place)."""
        body = {
            "index": self.index,
            "leader": dataclasses.asdict(self.leader),
            "http_fd": self.http_fd,
            "config": self.config.model_dump(mode="json"),
        }
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds a key
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(body))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> FollowerPlan:
        """The plan at `path`; OSError when unreadable, ValueError (a pydantic
        ValidationError for the config) when malformed."""
        body = json.loads(path.read_text())
        return cls(
            index=int(body["index"]),
            leader=Leader(**body["leader"]),
            http_fd=int(body["http_fd"]),
            config=HomingConfig.model_validate(body["config"]),
        )


#: The longest path `runtime_dir` adds to its directory: a follower's admin socket, as the
#: admin server first binds it (`homing.admin.server`: a private directory of 10
#: characters in the socket's own).
LONGEST_RUNTIME_PATH = len("/process-256/.bXXXXXXXX/admin.sock")


def runtime_dir(state_dir: str, max_socket_path: int) -> Path | None:
    """Where a leader keeps its followers' plans, sockets and shared files: `state_dir`'s
    "processes", or None when a socket there would be longer than `max_socket_path` (the
    caller then makes a private directory of a shorter path)."""
    path = Path(state_dir) / "processes"
    return path if len(str(path)) + LONGEST_RUNTIME_PATH <= max_socket_path else None


#: The name of the admin key the leader makes for its followers (`with_process_key`).
PROCESS_KEY_ID = "gateway-processes"


def with_process_key(cfg: HomingConfig, key: str) -> HomingConfig:
    """`cfg` with `key`'s digest among the admin keys, so followers can read the leader's
    workers; unchanged when the admin API has no keys (its socket then needs none)."""
    if not cfg.admin.keys:
        return cfg
    digest = hashlib.sha256(key.encode()).hexdigest()
    keys = [k for k in cfg.admin.keys if k.id != PROCESS_KEY_ID]
    keys.append(AdminKeySettings(id=PROCESS_KEY_ID, sha256=digest))
    return cfg.model_copy(update={"admin": cfg.admin.model_copy(update={"keys": keys})})


def follower_config(
    cfg: HomingConfig,
    *,
    workers: Sequence[Sequence[tuple[str, str]]],
    grpc_port: int,
    state_dir: str,
) -> HomingConfig:
    """The configuration of a follower of a leader running `cfg`.

    `workers`: per served model, in `cfg.served_models()` order, the (url, version) of the
    leader's workers now. `grpc_port`: the leader's bound gRPC port (shared on
    SO_REUSEPORT). `state_dir`: the follower's own directory, for its admin socket (its
    state directory stays the leader's: the rollout store there is read, not written).
    Every model lists those workers (nothing is launched) with its autoscaler off; the
    follower is one process, with its admin API on its socket only. ValueError (pydantic's)
    when the result does not validate, or `workers` has another length than the models."""
    specs = cfg.served_models()
    if len(workers) != len(specs):
        raise ValueError(f"{len(workers)} worker lists for {len(specs)} models")
    models = [
        spec.model_copy(
            update={
                "workers": [WorkerEntry(url=url, version=version) for url, version in listed],
                "sim": None,
                "scaler": None,
            }
        )
        for spec, listed in zip(specs, workers, strict=True)
    ]
    gateway = cfg.gateway.model_copy(update={"processes": 1, "grpc_port": grpc_port})
    # Its own admin socket; the state directory stays the leader's, whose rollout store
    # holds the version splits every process must route by.
    admin = cfg.admin.model_copy(update={"socket": f"{state_dir}/admin.sock", "port": None})
    engines = cfg.engines.model_copy(update={"workers": [], "launch": "sim"})
    follower = cfg.model_copy(
        update={
            "models": models,
            "gateway": gateway,
            "admin": admin,
            "engines": engines,
            "scaler": ScalerSettings(enabled=False),
        }
    )
    return HomingConfig.model_validate(follower.model_dump(mode="json"))
