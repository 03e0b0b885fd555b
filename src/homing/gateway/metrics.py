"""Prometheus metrics of the gateway: auth, quotas, admission, retries and stream migrations.

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

#: `homing_retries_total` outcomes of a retryable worker failure before the client's first
#: byte (`homing.gateway.generation`): routed again, refused by the model's retry budget, no
#: worker left that the request has not tried, or the request's `max_retries` used up.
RETRY_OUTCOMES = ("retried", "budget_exhausted", "no_other_worker", "max_retries")

#: `homing_stream_migrations_total` outcomes of a stream whose worker failed after the client
#: got its first byte, with `router.migrate_streams` on: resumed on another worker, refused
#: by the retry budget, no other worker, the request already migrated once, prompt plus
#: tokens so far too long for a worker's prompt limit, or a constrained request
#: (`response_format`: the new worker's grammar state would start afresh), or one that asked
#: for log probabilities.
MIGRATION_OUTCOMES = (
    "migrated",
    "budget_exhausted",
    "no_other_worker",
    "max_migrations",
    "too_long",
    "constrained",
    "logprobs",
)


class GatewayMetrics:
    """Counters and gauges of auth, quotas, admission, retries and stream migrations."""

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
        self.retries = Counter(
            "homing_retries_total",
            "Retryable worker failures before the client's first byte, by model and outcome"
            " (retried, budget_exhausted, no_other_worker, max_retries).",
            ["model", "outcome"],
            registry=self.registry,
        )
        self.stream_migrations = Counter(
            "homing_stream_migrations_total",
            "Streams whose worker failed mid-way with router.migrate_streams on, by model and"
            " outcome (migrated: resumed on another worker; else the client got the error).",
            ["model", "outcome"],
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

    def start_model_at_zero(self, model: str) -> None:
        """Create `model`'s retry and migration series at 0 (see `start_at_zero`)."""
        for outcome in RETRY_OUTCOMES:
            self.retries.labels(model=model, outcome=outcome)
        for outcome in MIGRATION_OUTCOMES:
            self.stream_migrations.labels(model=model, outcome=outcome)

    def value(self, name: str, **labels: str) -> float:
        """The current value of sample `name` with `labels` (0 when absent); for tests."""
        return self.registry.get_sample_value(name, labels) or 0.0
