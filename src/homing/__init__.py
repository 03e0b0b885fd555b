"""homing: control plane of an LLM inference platform (gateway, router, autoscaler)."""

import os

__version__ = "0.1.0"

GRPC_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
"""gRPC core reads this variable once, when `grpc` is first imported in a process."""

GRPC_EXPERIMENTS_DEFAULT = "-event_engine_client"
"""What a homing process runs gRPC core with unless its environment names its own (an empty
value keeps gRPC's defaults). Client channels then do their socket I/O on grpc.aio's
completion-queue poller thread, with gRPC's iomgr, instead of on EventEngine threads that
hand each completion to that poller: one thread handoff fewer per engine message
(docs/benchmarks.md, "The engine-message path")."""

#: The variable as this process found it (None: unset), before the default below.
GRPC_EXPERIMENTS_INHERITED = os.environ.get(GRPC_EXPERIMENTS_ENV)

# Set on the package's import, so before any homing module imports grpc. The engines homing
# starts get the variable as it was found (`homing.lifeline.child_environ`).
os.environ.setdefault(GRPC_EXPERIMENTS_ENV, GRPC_EXPERIMENTS_DEFAULT)
