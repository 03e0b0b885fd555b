"""Composition root: builds the subsystems from the config, runs them, and stops them in order.

Start order: homing's own workers (embedded default only: simulated, or real SGLang with
`engines.launch = "sglang"`) -> worker pool (discovery, health, KV-event subscriptions
feeding the router) -> tokenizer (local directory or the worker's GetTokenizer bundle) ->
inference service -> HTTP and gRPC listeners -> admin API (`homing.admin.server`, on its
Unix socket and optional TCP port, when `admin.enabled`).
Stop order (SIGINT/SIGTERM): close the admin API, stop accepting (listeners closed, health
NOT_SERVING), let in-flight requests finish up to `gateway.drain_timeout_s`, end those still
open with a 503 `drained` error (a stream as its last event), then stop the pool and
homing's own workers. `reload` applies a new configuration in place
(`homing.config.reload_plan` says what may change); signals and systemd's notifications are
`homing.daemon.runner`'s.

Modules, one per job: `root` (`App`: the start order, readiness and status), `parts` (what
an `App` holds), `assembly` (building each component from the config), `listeners` (the
HTTP, gRPC and admin sockets, TLS, sockets handed over by socket activation), `shutdown`
(the drain and stop sequence) and `reload` (carrying out a reload plan).
"""

from homing.app.assembly import SCALER_BURN_WINDOW_S, served_fingerprint
from homing.app.parts import slo_of
from homing.app.reload import ReloadRefused
from homing.app.root import App

__all__ = ["SCALER_BURN_WINDOW_S", "App", "ReloadRefused", "served_fingerprint", "slo_of"]
