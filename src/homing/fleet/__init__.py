"""The fleet: the served models, each a `ModelDispatch` over a pool of workers that join,
drain and leave while it serves (`Fleet`). The gateway reaches a model's pool, router,
admission and tokenizer only through its `ModelDispatch`."""

from homing.fleet.dispatch import Admitter, Lease, ModelDispatch, NoReplica
from homing.fleet.fleet import (
    DuplicateWorker,
    Fleet,
    FleetError,
    InvalidWorker,
    UnknownModel,
    UnknownWorker,
    WrongPhase,
)

__all__ = [
    "Admitter",
    "DuplicateWorker",
    "Fleet",
    "FleetError",
    "InvalidWorker",
    "Lease",
    "ModelDispatch",
    "NoReplica",
    "UnknownModel",
    "UnknownWorker",
    "WrongPhase",
]
