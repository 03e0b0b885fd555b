"""The autoscaler's Prometheus series, per model.

`homing_scaler_desired_replicas{model,kind}` (kind "ready" / "warm"): the latest decision;
`homing_scaler_replicas{model,state}` ("ready", "warm", "starting", "draining"): what the
pool has; `homing_scaler_decisions_total{model,reason,mode}`: decisions by reason and mode
("active", "advisory", "follower", "lease-unreachable");
`homing_scaler_cold_start_seconds{model}`: the actuator's measured cold start (no series
before one); `homing_scaler_capacity{model,kind}`: the measured per-replica goodput
("decode_streams", "prefill_tokens_per_s"); `homing_scaler_demand{model,kind}` ("streams",
"prefill_tokens_per_s", "arrivals_per_s"); `homing_scaler_failed_starts_total`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ScalerMetrics:
    """The series above, registered once on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.desired = Gauge(
            "homing_scaler_desired_replicas",
            "Replicas the autoscaler's latest decision wants, by kind (ready, warm).",
            ["model", "kind"],
            registry=registry,
        )
        self.replicas = Gauge(
            "homing_scaler_replicas",
            "Replicas of the pool by state (ready, warm, starting, draining).",
            ["model", "state"],
            registry=registry,
        )
        self.decisions = Counter(
            "homing_scaler_decisions",
            "Autoscaler decisions by reason and mode (active acts, advisory only reports).",
            ["model", "reason", "mode"],
            registry=registry,
        )
        self.cold_start = Gauge(
            "homing_scaler_cold_start_seconds",
            "Measured cold start of a replica (asked for -> ready), median of recent ones.",
            ["model"],
            registry=registry,
        )
        self.capacity = Gauge(
            "homing_scaler_capacity",
            "Measured goodput of one replica (decode_streams, prefill_tokens_per_s).",
            ["model", "kind"],
            registry=registry,
        )
        self.demand = Gauge(
            "homing_scaler_demand",
            "Demand on the pool (streams, prefill_tokens_per_s, arrivals_per_s).",
            ["model", "kind"],
            registry=registry,
        )
        self.failed_starts = Counter(
            "homing_scaler_failed_starts",
            "Replica starts that failed (exited or never became ready).",
            ["model"],
            registry=registry,
        )
