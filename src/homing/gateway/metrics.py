"""Prometheus metrics of the gateway's auth, quota and admission paths.

Rule of this file: one `GatewayMetrics` per process (per `App`), on its own
`CollectorRegistry` (so several Apps in one test process do not collide); the registry is
what a `/metrics` endpoint exposes. Names follow Prometheus conventions (`_total` counters,
base units: seconds).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: `homing_admission_rejected_total` reasons (`homing.gateway.admission`).
ADMISSION_REASONS = ("queue_full", "tenant_full", "displaced", "timeout")


class GatewayMetrics:
    """Counters and gauges of auth, quotas and admission."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.auth_failures = Counter(
            "homing_auth_failures_total",
            "Requests refused by authentication (401) or model access (403/404).",
            ["reason"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "homing_rate_limited_total",
            "Requests refused with 429 by a quota, by quota kind and tenant (configured names).",
            ["quota", "tenant"],
            registry=self.registry,
        )
        self.quota_store_errors = Counter(
            "homing_quota_store_errors_total",
            "Quota store calls that failed; action is fail_closed (503) or fail_open (admitted"
            " uncounted) for reservations, or none for settle/renew.",
            ["operation", "action"],
            registry=self.registry,
        )
        self.admission_queue_depth = Gauge(
            "homing_admission_queue_depth",
            "Requests waiting in the admission queue.",
            ["model"],
            registry=self.registry,
        )
        self.admission_rejected = Counter(
            "homing_admission_rejected_total",
            "Requests refused with 503 by admission (queue full, tenant's share full, timeout).",
            ["reason"],
            registry=self.registry,
        )
        self.admission_wait = Histogram(
            "homing_admission_wait_seconds",
            "Time requests spent in the admission queue before being admitted.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )

        self.stream_interval = Gauge(
            "homing_stream_interval_tokens",
            "Tokens per streamed engine chunk asked of the model's workers (1: none asked, the"
            " workers' own --stream-interval applies).",
            ["model"],
            registry=self.registry,
        )
        self.loop_busy = Gauge(
            "homing_event_loop_busy_ratio",
            "Seconds the event loop's thread ran or waited for a CPU per wall second, over the"
            " last sample.",
            registry=self.registry,
        )

    def start_at_zero(self, tenants: Iterable[str], quotas: Iterable[str]) -> None:
        """Create the refusal series every configured tenant, quota kind and admission
        reason can take, at 0, so `rate()` sees their first increase (a counter first
        exported above 0 shows none)."""
        kinds = tuple(quotas)
        for tenant in tenants:
            for quota in kinds:
                self.rate_limited.labels(quota=quota, tenant=tenant)
        for reason in ADMISSION_REASONS:
            self.admission_rejected.labels(reason=reason)

    def value(self, name: str, **labels: str) -> float:
        """The current value of sample `name` with `labels` (0 when absent); for tests."""
        return self.registry.get_sample_value(name, labels) or 0.0
