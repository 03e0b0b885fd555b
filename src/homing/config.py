"""Typed configuration: a TOML file read into pydantic models; every default is the embedded one.

With no file, `homing serve` runs the embedded default: simulated workers started as child
processes (`sim`; `engines.launch = "sglang"` starts real SGLang ones, section `sglang`),
the gateway on 127.0.0.1:8080 (HTTP) and 127.0.0.1:50051 (gRPC).
A file that lists `engines.workers` (`grpc://host:port`) serves those SGLang workers instead.
Unknown keys are errors, so a typo in a config file is reported rather than ignored.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GatewaySettings(_Section):
    """HTTP and gRPC listeners and request limits."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    grpc_host: str = "127.0.0.1"
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    request_timeout_s: float = Field(default=600.0, gt=0)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    # Input limits (see homing.gateway.http and http_server): all request header bytes
    # together (431 past it), header lines per request (431; default 100 as Envoy's
    # max_headers_count), chat messages per request (400), time to receive a request head
    # after connecting or after the previous response (the connection is closed), time to
    # receive the body once the head is in (408).
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    max_header_count: int = Field(default=100, ge=8, le=10_000)
    max_messages: int = Field(default=2048, ge=1)
    header_timeout_s: float = Field(default=30.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    # TLS for both listeners: PEM certificate chain and private key (both or neither).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewaySettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        return self


RoutingPolicy = Literal["cache_aware", "round_robin", "least_load", "consistent_hash"]

_INT32_MAX = 2**31 - 1  # SGLang's SamplingParams.stream_interval is an int32


def _stream_interval(value: object) -> object:
    if value == "auto" or (type(value) is int and 1 <= value <= _INT32_MAX):
        return value
    raise ValueError(f'must be an integer from 1 to {_INT32_MAX} or "auto", got {value!r}')


# Tokens per streamed chunk sent to the engine (SGLang `SamplingParams.stream_interval`): a
# fixed count, or "auto" (homing.fleet.stream_interval) up to `max_stream_interval`.
StreamInterval = Annotated[int | Literal["auto"], BeforeValidator(_stream_interval)]
MaxStreamInterval = Annotated[int, Field(ge=1, le=_INT32_MAX, strict=True)]


class CostWeightSettings(_Section):
    """Weights of the router's scoring rule `cost = a*U + b*Q + d*L` (homing.router.cost):
    `prefill` a per uncached prompt token, `queue` b per queued prefill token, `decode` d in
    tokens per request on the worker, `lower_tier_worth` h: share of a recompute that a
    host/remote-tier hit saves."""

    prefill: float = Field(default=3.0, ge=0, allow_inf_nan=False)
    queue: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    decode: float = Field(default=128.0, ge=0, allow_inf_nan=False)
    lower_tier_worth: float = Field(default=0.8, ge=0, le=1)


class RouterModelSettings(_Section):
    """Per-model overrides of `RouterSettings` (keyed by served model name); unset fields
    take the router-wide value."""

    policy: RoutingPolicy | None = None
    weights: CostWeightSettings | None = None
    load_factor: float | None = Field(default=None, ge=1)
    min_match_ratio: float | None = Field(default=None, ge=0, le=1)


class RouterSettings(_Section):
    """Routing for the model's pool (homing.router): the policy, the scoring rule's weights,
    the bounded-load factors (c for the ring, c_hit for affinity) and their floors, the
    overload veto, and the affinity index's global budget, approximate-mode TTL and
    exact-mode booking TTL. `models` overrides policy and weights per served model name."""

    policy: RoutingPolicy = "cache_aware"
    block_size: int = Field(default=16, ge=1)
    weights: CostWeightSettings = Field(default_factory=CostWeightSettings)
    load_factor: float = Field(default=1.25, ge=1)
    min_bound: int = Field(default=4, ge=1)
    hit_load_factor: float = Field(default=1.5, ge=1)
    hit_min_bound: int = Field(default=8, ge=1)
    ring_choices: int = Field(default=3, ge=1)
    vnodes: int = Field(default=160, ge=1)
    min_match_ratio: float = Field(default=0.05, ge=0, le=1)
    max_token_usage: float = Field(default=0.95, gt=0, le=1)
    max_waiting: int = Field(default=32, ge=1)
    index_budget_mb: float = Field(default=160.0, gt=0)
    approx_ttl_s: float = Field(default=120.0, gt=0)
    booking_ttl_s: float | None = Field(default=None, gt=0)
    # Retries of a failed worker call before the client's first byte, each on a worker the
    # request has not tried (homing.gateway.retry_budget): at most `max_retries` per request,
    # and per model only while retries over the last `retry_window_s` seconds stay within
    # `retry_budget_ratio` of its requests plus `retry_min_per_s` a second (Finagle's retry
    # budget: 0.2 of requests, 10 s window). Two retries by default, so a request still
    # reaches a third worker while two fail at once (Envoy's default is one; gRPC's retry
    # policy allows up to four). `migrate_streams`: a stream whose worker fails
    # after the client got its first byte resumes on another worker (once, in the same
    # budget) instead of ending with an error event.
    max_retries: int = Field(default=2, ge=0, le=10, strict=True)
    retry_budget_ratio: float = Field(default=0.2, ge=0, le=1, allow_inf_nan=False, strict=True)
    retry_min_per_s: float = Field(default=3.0, ge=0, le=10_000, allow_inf_nan=False, strict=True)
    retry_window_s: float = Field(default=10.0, ge=1, le=60, allow_inf_nan=False, strict=True)
    migrate_streams: bool = Field(default=False, strict=True)
    models: dict[str, RouterModelSettings] = Field(default_factory=dict)


_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]


class OutlierSettings(_Section):
    """Outlier ejection (`[engines.outliers]`; homing.engines.outliers has the rule and each
    default's source). Every `interval_s` a ready worker with at least `min_requests`
    requests in the last `window_s` seconds whose TPOT or TTFT per uncached prompt token is
    over `factor` x the other workers' median (TTFT only where requests average at least
    `min_uncached_tokens` uncached prompt tokens), or whose error ratio is at least
    `error_ratio` and over `factor` x theirs, for `consecutive` intervals is ejected for
    `base_ejection_s` doubling per ejection up to `max_ejection_s`; at most
    `max_ejected_fraction` of the pool at once (at least one of two), never its last ready
    worker. After its time it is probed (a short generation, `probe_timeout_s` at most)
    beside a ready peer and returns when its TPOT is within `factor` x the peer's."""

    enabled: bool = Field(default=True, strict=True)
    interval_s: _Seconds = 5.0
    window_s: _Seconds = 15.0
    factor: float = Field(default=3.0, gt=1, allow_inf_nan=False, strict=True)
    consecutive: int = Field(default=2, ge=1, strict=True)
    min_requests: int = Field(default=5, ge=1, strict=True)
    min_uncached_tokens: int = Field(default=256, ge=0, strict=True)
    error_ratio: float = Field(default=0.5, gt=0, le=1, strict=True)
    base_ejection_s: _Seconds = 10.0
    max_ejection_s: _Seconds = 300.0
    max_ejected_fraction: float = Field(default=0.5, gt=0, le=1, strict=True)
    probe_timeout_s: _Seconds = 10.0

    @model_validator(mode="after")
    def _ordered(self) -> OutlierSettings:
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError("max_ejection_s must be at least base_ejection_s")
        if self.window_s > 60.0:
            raise ValueError("window_s must be at most 60 (the request records kept)")
        return self


class BreakerSettings(_Section):
    """The per-worker circuit breaker (`[engines.breaker]`; homing.engines.breaker):
    `consecutive` transport failures of requests open it; after `open_s` (doubling on each
    re-open, up to `max_open_s`) one trial request is let through, whose success closes it."""

    enabled: bool = Field(default=True, strict=True)
    consecutive: int = Field(default=5, ge=1, strict=True)
    open_s: _Seconds = 1.0
    max_open_s: _Seconds = 30.0

    @model_validator(mode="after")
    def _ordered(self) -> BreakerSettings:
        if self.max_open_s < self.open_s:
            raise ValueError("max_open_s must be at least open_s")
        return self


class EngineSettings(_Section):
    """The SGLang workers to serve and how to probe them. With `workers` empty, homing
    starts its own: simulated ones (`launch = "sim"`, section `sim`) or real SGLang ones
    (`launch = "sglang"`, section `sglang`). `progress_window_s`: a probe that times out on
    a busy worker whose KV-event stream showed engine work in the last that many seconds is
    not counted against it (homing.engines.health). `outliers`, `breaker`: the sections
    above."""

    workers: list[str] = Field(default_factory=list)
    launch: Literal["sim", "sglang"] = "sim"
    tokenizer_path: str | None = None
    startup_timeout_s: float = Field(default=120.0, gt=0)
    health_interval_s: float = Field(default=1.0, gt=0)
    health_timeout_s: float = Field(default=2.0, gt=0)
    unhealthy_threshold: int = Field(default=3, ge=1)
    healthy_threshold: int = Field(default=2, ge=1)
    # The single model's stream interval (as `[[models]]` `stream_interval`; with
    # `[[models]]` each model has its own and these are not used).
    stream_interval: StreamInterval = 1
    max_stream_interval: MaxStreamInterval = 8
    progress_window_s: _Seconds = 5.0
    outliers: OutlierSettings = Field(default_factory=OutlierSettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)

    @field_validator("workers")
    @classmethod
    def _grpc_urls(cls, urls: list[str]) -> list[str]:
        from homing.engines.pool import check_worker_url

        return [check_worker_url(url) for url in urls]


class SimSettings(_Section):
    """The embedded default: simulated SGLang workers started as child processes."""

    workers: int = Field(default=2, ge=1, le=64)
    model: str = "llama-3.1-8b"
    gpu: str = "H100"
    tp: int | None = Field(default=None, ge=1)  # None: the preset's TP (8 for 70b)
    speedup: float = Field(default=1.0, gt=0)
    extra_args: list[str] = Field(default_factory=list)
    served_model_name: str | None = None  # None: the preset's name (`model`)


class SglangSettings(_Section):
    """Real SGLang workers started as child processes (`homing worker`) when
    `engines.launch = "sglang"` and `engines.workers` is empty.

    `model_path`: the model directory (required then). `python`: the interpreter with
    sglang (None: `homing.engines.sglang_launch.default_python`). `device`: auto (cuda when
    `nvidia-smi` runs), cpu or cuda. `max_total_tokens`: KV pool per worker, tokens.
    `extra_args`: passed to `sglang.launch_server` as they are. `startup_timeout_s`: per
    worker, to serving. `health_timeout_s`: replaces `engines.health_timeout_s` for these
    workers, whose HealthCheck is a one-token generation inside the engine (20 s: SGLang's
    own SGLANG_HEALTH_CHECK_TIMEOUT default).
    """

    model_path: str | None = None
    workers: int = Field(default=2, ge=1, le=64)
    python: str | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_total_tokens: int = Field(default=65536, ge=1)
    tp: int = Field(default=1, ge=1)
    extra_args: list[str] = Field(default_factory=list)
    startup_timeout_s: float = Field(default=300.0, gt=0)
    health_timeout_s: float = Field(default=20.0, gt=0)


class WorkerEntry(_Section):
    """A configured worker: its `grpc://host:port` URL and `version` label (engine or
    weights revision; default the model's `version`)."""

    url: str
    version: str | None = Field(default=None, max_length=128, pattern=r"^[ -~]*$")

    @field_validator("url")
    @classmethod
    def _grpc_url(cls, url: str) -> str:
        from homing.engines.pool import check_worker_url

        return check_worker_url(url)


class SloSettings(_Section):
    """A model's SLO (`[slo]` for every model, `[[models]] slo` for one): p95 targets for
    TTFT and TPOT (seconds; the seed's 500 ms and 50 ms), the per-request rule a request
    must meet to count as goodput (`request_ttft_s` / `request_tpot_s`, default the p95
    targets) and the objective: the fraction of requests that must meet it (its error
    budget is 1 - objective)."""

    ttft_p95_s: float = Field(default=0.5, gt=0, allow_inf_nan=False, strict=True)
    tpot_p95_s: float = Field(default=0.05, gt=0, allow_inf_nan=False, strict=True)
    request_ttft_s: float | None = Field(default=None, gt=0, allow_inf_nan=False, strict=True)
    request_tpot_s: float | None = Field(default=None, gt=0, allow_inf_nan=False, strict=True)
    objective: float = Field(default=0.95, gt=0, lt=1, allow_inf_nan=False, strict=True)


class ObsSettings(_Section):
    """Observability (`[obs]`). `request_metrics`: the per-request series on `/metrics`
    (off: the log line, SLO gauges and worker snapshots only). `tenant_labels`: add a
    `tenant` label to the request series (off by default: one series set per worker,
    whatever the number of tenants)."""

    request_metrics: bool = Field(default=True, strict=True)
    tenant_labels: bool = Field(default=False, strict=True)


class ExecActuatorSettings(_Section):
    """The `exec` actuator (`[scaler.exec]`): `command` is called with `scale N` (the desired
    replica count) and `list`, and prints its members, one `<id> <grpc://host:port or ->` per
    line (homing.scaler.actuators.exec); `list` every `poll_s` (0.1 to 3600 s), each call
    at most `timeout_s`."""

    command: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    poll_s: float = Field(default=2.0, ge=0.1, le=3600, allow_inf_nan=False, strict=True)
    timeout_s: _Seconds = 60.0


#: A Kubernetes namespace (an RFC 1123 label) and an object name (an RFC 1123 subdomain), as
#: the API server validates them.
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class KubernetesActuatorSettings(_Section):
    """The `kubernetes` actuator (`[scaler.kubernetes]`): scales the Deployment or
    StatefulSet `name` in `namespace` through its `scale` subresource and finds its workers
    by watching the Pods that match `selector` (their IP, the container port named
    `port_name`, their Ready condition). `kubeconfig`: a file (None: in-cluster config, else
    the default kubeconfig)."""

    namespace: str = Field(default="default", pattern=_DNS_LABEL, max_length=63)
    name: str = Field(pattern=_DNS_SUBDOMAIN, max_length=253)
    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    selector: str = Field(min_length=1, max_length=1024)
    port_name: str = Field(default="grpc", min_length=1, max_length=63)
    kubeconfig: str | None = None


class ScalerSettings(_Section):
    """The autoscaler of a model's pool (`[scaler]` for every model, `[[models]] scaler` for
    one; homing.scaler.policy has the rules and each default's source).

    `enabled`: run it. `mode`: "active" acts; "advisory" logs and exports each decision
    (metrics `homing_scaler_*`) without acting. `actuator`: "local" starts and stops workers
    on this host (the model's simulated workers, or `sglang` ones), "exec" calls a script
    (`exec`), "kubernetes" scales a workload (`kubernetes`); `command`: with "local", a
    command template to start each replica with instead (placeholders `{host}`, `{port}`,
    `{model}`, `{index}`; homing.scaler.actuators.local), ready within `startup_timeout_s`.
    Every `tick_s` (0.1 to 3600 s) it sizes the
    pool: demand over the measured goodput per replica (decode streams and prefill tokens/s,
    seeded by `decode_streams_per_replica` / `prefill_tokens_per_s_per_replica`, None: from
    the simulated worker's timing model, else conservative defaults) plus `headroom`, in
    [`min_replicas`, `max_replicas`]; a fast path adds steps sized by the measured cold
    start (`default_cold_start_s` before one is measured); it scales down only after
    `scale_down_window_s` below, `scale_down_cooldown_s` after a scale-up, beyond
    `hysteresis`, by at most `max_scale_down_fraction` at a time; up by at most
    max(`max_scale_up_replicas`, `max_scale_up_fraction` x ready) a tick. `warm_replicas`
    started but idle (None: the replicas that the growth expected during one cold start
    needs beyond the target, at most `max_warm_replicas`). `scale_to_zero` with
    `min_replicas = 0`: no replica after `idle_to_zero_s` without requests.
    `gpus_per_replica` (None: the simulated preset's TP, else 1) counts against
    `gpu_budget` (all pools together; set it in `[scaler]`).
    `leader`: with several gateway instances, the one that actuates the pool: "single"
    (this instance alone), "redis" (a lease in Redis at `leader_redis_url`, default
    `quotas.redis_url`) or "kubernetes" (a coordination.k8s.io Lease in `leader_namespace`,
    default the workload's namespace), renewed within `leader_lease_s` (1 to 3600 s); the
    others follow the pool's membership and report their decisions as "follower" (as
    "lease-unreachable" while they cannot reach the store; homing.scaler.leader).
    `kubernetes` also gives the Lease elector its kubeconfig and default namespace.
    """

    enabled: bool = Field(default=False, strict=True)
    mode: Literal["active", "advisory"] = "active"
    actuator: Literal["local", "exec", "kubernetes"] = "local"
    tick_s: float = Field(default=5.0, ge=0.1, le=3600, allow_inf_nan=False, strict=True)
    min_replicas: int = Field(default=1, ge=0, le=10_000, strict=True)
    max_replicas: int = Field(default=8, ge=1, le=10_000, strict=True)
    headroom: float = Field(default=0.2, ge=0, le=10, allow_inf_nan=False, strict=True)
    target_utilisation: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False, strict=True)
    scale_down_window_s: _Seconds = 120.0
    scale_down_cooldown_s: float = Field(default=60.0, ge=0, allow_inf_nan=False, strict=True)
    hysteresis: float = Field(default=0.1, ge=0, lt=1, allow_inf_nan=False, strict=True)
    max_scale_up_replicas: int = Field(default=4, ge=1, le=10_000, strict=True)
    max_scale_up_fraction: float = Field(
        default=1.0, gt=0, le=100, allow_inf_nan=False, strict=True
    )
    max_scale_down_fraction: float = Field(
        default=0.25, gt=0, le=1, allow_inf_nan=False, strict=True
    )
    warm_replicas: int | None = Field(default=None, ge=0, le=10_000, strict=True)
    max_warm_replicas: int = Field(default=2, ge=0, le=10_000, strict=True)
    default_cold_start_s: _Seconds = 60.0
    scale_to_zero: bool = Field(default=False, strict=True)
    idle_to_zero_s: _Seconds = 300.0
    gpus_per_replica: int | None = Field(default=None, ge=1, le=1024, strict=True)
    gpu_budget: int | None = Field(default=None, ge=1, strict=True)
    decode_streams_per_replica: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, strict=True
    )
    prefill_tokens_per_s_per_replica: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, strict=True
    )
    startup_timeout_s: _Seconds = 300.0
    command: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)
    exec: ExecActuatorSettings | None = None
    kubernetes: KubernetesActuatorSettings | None = None
    leader: Literal["single", "redis", "kubernetes"] = "single"
    leader_lease_s: float = Field(default=10.0, ge=1, le=3600, allow_inf_nan=False, strict=True)
    leader_redis_url: str | None = None
    leader_namespace: str | None = Field(default=None, pattern=_DNS_LABEL, max_length=63)

    @model_validator(mode="after")
    def _consistent(self) -> ScalerSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError("scaler.min_replicas must not exceed max_replicas")
        if self.min_replicas == 0 and not self.scale_to_zero:
            raise ValueError("scaler.min_replicas = 0 needs scale_to_zero = true")
        if self.actuator == "exec" and self.exec is None:
            raise ValueError('scaler.actuator = "exec" needs a [scaler.exec] command')
        if self.actuator == "kubernetes" and self.kubernetes is None:
            raise ValueError('scaler.actuator = "kubernetes" needs a [scaler.kubernetes] table')
        if self.exec is not None and self.actuator != "exec":
            raise ValueError(
                f'[scaler.exec] is the "exec" actuator\'s table, but scaler.actuator is '
                f'"{self.actuator}"'
            )
        if self.kubernetes is not None and "kubernetes" not in (self.actuator, self.leader):
            raise ValueError(
                "[scaler.kubernetes] is the \"kubernetes\" actuator's and Lease elector's "
                f'table, but scaler.actuator is "{self.actuator}" and leader "{self.leader}"'
            )
        room = self.max_replicas - self.min_replicas
        if self.warm_replicas is not None and self.warm_replicas > room:
            raise ValueError(
                f"scaler.warm_replicas ({self.warm_replicas}) must not exceed max_replicas - "
                f"min_replicas ({room}): warm replicas come on top of the ready ones"
            )
        if self.command is not None:
            if self.actuator != "local":
                raise ValueError('scaler.command is the "local" actuator\'s command template')
            from homing.scaler.actuators.local import CommandTemplate

            CommandTemplate(list(self.command))  # ValueError naming a bad placeholder
        return self


def check_version_label(label: str) -> str:
    """`label` if it is a valid version label (1-128 printable ASCII characters); ValueError
    naming it otherwise."""
    if not 1 <= len(label) <= 128 or not all(" " <= c <= "~" for c in label):
        raise ValueError(
            f"a version label must be 1 to 128 printable ASCII characters, got {label!r:.60}"
        )
    return label


class RolloutSettings(_Section):
    """Model rollouts (`[rollout]`, homing.rollout): the defaults of `homing rollout start`
    and the verdict's rule.

    `steps`: the canary's weights in percent, increasing, the last 100 (reaching 100
    promotes it). `bake_s`: how long each step runs before its verdict may move it on.
    `window_s`: the comparison's sliding window (seconds; samples of the current step
    only). `min_requests` / `min_latency_samples` and the margins: the verdict's rule
    (homing.rollout.compare.VerdictRule: attainment at most `attainment_margin` below the
    baseline's, error rate at most `error_margin` above, TTFT per uncached prompt token
    and TPOT p50 at most `latency_margin` above, each with the sample size to show it).
    `on_rollback`: "drain" the canary's workers or "keep" them (weight 0, for inspection).
    `tick_s`: how often a rollout's verdict is taken.
    """

    steps: list[float] = Field(default_factory=lambda: [5.0, 25.0, 50.0, 100.0])
    bake_s: float = Field(default=600.0, ge=0, le=7 * 86400, allow_inf_nan=False)
    window_s: float = Field(default=600.0, ge=1, le=86400, allow_inf_nan=False)
    min_requests: int = Field(default=250, ge=1, le=10_000)
    min_latency_samples: int = Field(default=30, ge=1, le=10_000)
    attainment_margin: float = Field(default=0.02, ge=0, lt=1, allow_inf_nan=False)
    error_margin: float = Field(default=0.01, ge=0, lt=1, allow_inf_nan=False)
    latency_margin: float = Field(default=0.25, ge=0, le=100, allow_inf_nan=False)
    on_rollback: Literal["drain", "keep"] = "drain"
    tick_s: float = Field(default=1.0, ge=0.1, le=60, allow_inf_nan=False)

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[float]) -> list[float]:
        from homing.rollout.plan import check_steps

        return check_steps(steps)


class ModelSettings(_Section):
    """One served model (`[[models]]`): its pool of workers and how requests are routed.

    `name`: the served model name clients send and every worker must report (None: the
    first worker's). `workers`: its SGLang workers (`grpc://host:port` or tables with `url`
    and `version`); with none, homing starts its simulated fleet `sim` (default: the
    top-level `sim` section with `sim.model` = `name` when set). `version`: the default
    version label of its workers. `policy` and `weights`: routing overrides for this model
    (default `router.policy` and `router.weights`). `tokenizer_path`: a local tokenizer
    directory (default: the workers' GetTokenizer bundle). `stream_interval`: tokens per
    streamed chunk asked of the engine (SGLang's `stream_interval`; 1 asks nothing, so the
    workers' own `--stream-interval` applies, 1 by default),
    or "auto": from 1 up to `max_stream_interval` while the gateway's event loop is the
    bottleneck (homing.fleet.stream_interval); larger chunks cost the gateway less per
    token and make the client see tokens in bursts. The first token is never held back.
    `slo` / `scaler`: this model's SLO and autoscaler (default: the top-level sections).
    `versions`: the weighted split of its versions, version label -> weight (relative,
    percent in practice; homing.router.versions); a version left out gets no requests
    unless pinned. None: every ready worker takes requests, whatever its version.
    `tool_call_parser` / `reasoning_parser`: how its answers' tool calls and reasoning are
    parsed (names in `homing.text.parsers`; "none" turns one off); None: the parser its
    chat template implies, if any.
    """

    name: str | None = Field(default=None, min_length=1, max_length=256)
    workers: list[str | WorkerEntry] = Field(default_factory=list)
    sim: SimSettings | None = None
    version: str = Field(default="", max_length=128, pattern=r"^[ -~]*$")
    policy: RoutingPolicy | None = None
    weights: CostWeightSettings | None = None
    tokenizer_path: str | None = None
    stream_interval: StreamInterval = 1
    max_stream_interval: MaxStreamInterval = 8
    slo: SloSettings | None = None
    scaler: ScalerSettings | None = None
    versions: dict[str, float] | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, name: str | None) -> str | None:
        from homing.text.parsers import TOOL_PARSERS

        if name is not None and name != "none" and name not in TOOL_PARSERS:
            known = ", ".join(sorted(TOOL_PARSERS))
            raise ValueError(f"unknown tool_call_parser {name!r} (known: none, {known})")
        return name

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, name: str | None) -> str | None:
        from homing.text.parsers import REASONING_PARSERS

        if name is not None and name != "none" and name not in REASONING_PARSERS:
            known = ", ".join(REASONING_PARSERS)
            raise ValueError(f"unknown reasoning_parser {name!r} (known: none, {known})")
        return name

    @field_validator("versions")
    @classmethod
    def _split(cls, versions: dict[str, float] | None) -> dict[str, float] | None:
        if versions is None:
            return None
        for label in versions:
            check_version_label(label)
        from homing.router.versions import VersionSplit

        return VersionSplit(versions).weights

    @field_validator("workers")
    @classmethod
    def _urls(cls, workers: list[str | WorkerEntry]) -> list[str | WorkerEntry]:
        from homing.engines.pool import check_worker_url

        return [check_worker_url(e) if isinstance(e, str) else e for e in workers]

    @field_validator("name")
    @classmethod
    def _printable_name(cls, name: str | None) -> str | None:
        if name is not None and not name.isprintable():
            raise ValueError(
                "a model name must hold no control or unprintable characters (clients send "
                "it, engines report it and log lines carry it)"
            )
        return name

    @model_validator(mode="after")
    def _split_needs_a_carried_version(self) -> ModelSettings:
        if self.versions is None:
            return self
        carried = (
            {version for _, version in self.worker_specs()} if self.workers else {self.version}
        )
        weighted = sorted(v for v, w in self.versions.items() if w > 0)
        if not carried & set(weighted):
            listed = ", ".join(repr(v) for v in sorted(carried))
            raise ValueError(
                f"versions gives weight to {', '.join(repr(v) for v in weighted)} but the "
                f"model's workers carry {listed}: no request could be served"
            )
        return self

    @model_validator(mode="after")
    def _overrides_need_a_name(self) -> ModelSettings:
        if self.name is None and (self.policy is not None or self.weights is not None):
            raise ValueError("a model's policy or weights need its name (models.name)")
        return self

    def worker_specs(self) -> list[tuple[str, str]]:
        """(url, version) of each configured worker."""
        out = []
        for entry in self.workers:
            if isinstance(entry, str):
                out.append((entry, self.version))
            else:
                out.append((entry.url, self.version if entry.version is None else entry.version))
        return out


class AdminSettings(_Section):
    """The admin API (`homing.v1.Admin`) and its listener.

    `socket`: a Unix socket path (default `state_dir/admin.sock`; mode 0600); "" turns the
    socket off. `host` and `port`: a TCP listener as well (port None: none), which needs
    `keys`. `keys`: admin keys as SHA-256 hex digests (`printf %s "$KEY" | sha256sum`),
    separate from tenant keys; with none, only the socket's file mode guards the API.
    `state_dir`: where the socket lives (default `$HOMING_STATE_DIR`, else
    `$XDG_RUNTIME_DIR/homing`, else `/tmp/homing-<uid>`). `enabled`: False serves no admin
    API at all.
    """

    enabled: bool = True
    state_dir: str | None = None
    socket: str | None = None
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)
    keys: list[AdminKeySettings] = Field(default_factory=list)

    @model_validator(mode="after")
    def _tcp_needs_keys(self) -> AdminSettings:
        if self.enabled and self.port is not None and not self.keys:
            raise ValueError("an admin TCP listener (admin.port) needs admin.keys")
        return self

    def socket_path(self) -> str | None:
        """The Unix socket to serve (None: no socket)."""
        import os

        if not self.enabled or self.socket == "":
            return None
        if self.socket is not None:
            return self.socket
        return os.path.join(default_state_dir(self.state_dir), "admin.sock")


class AdminKeySettings(_Section):
    """One admin key: a name for logs and its SHA-256 hex digest (never the key)."""

    id: str = Field(min_length=1, max_length=128)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")

    @field_validator("sha256")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


def default_state_dir(configured: str | None = None) -> str:
    """homing's state directory: `configured`, else `$HOMING_STATE_DIR`, else
    `$XDG_RUNTIME_DIR/homing`, else `/tmp/homing-<uid>`."""
    import os

    if configured:
        return configured
    if os.environ.get("HOMING_STATE_DIR"):
        return os.environ["HOMING_STATE_DIR"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "homing")
    return f"/tmp/homing-{os.getuid()}"


class QuotaLimits(_Section):
    """Limits of one tenant or one API key; None (absent) = unlimited.

    `requests_per_minute` and `tokens_per_minute` count over a sliding window of
    `quotas.window_s` (60 s: the names' meaning); tokens are prompt + completion, reserved
    at admission as prompt + n * max_tokens and reconciled with the engine's counts at the
    end. `concurrent_streams`: requests in flight at once (streamed or not).
    """

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    concurrent_streams: int | None = Field(default=None, ge=1)

    @property
    def unlimited(self) -> bool:
        """True when no limit is set."""
        return (
            self.requests_per_minute is None
            and self.tokens_per_minute is None
            and self.concurrent_streams is None
        )


class ApiKeySettings(_Section):
    """One API key of a tenant, stored as the SHA-256 hex digest of the key (never the key).

    `id`: a name for logs and errors. `models`: narrows the tenant's models for this key
    (None = the tenant's). `quota`: limits of this key on top of the tenant's.
    Make a hash with `printf %s "$KEY" | sha256sum`.
    """

    id: str = Field(min_length=1, max_length=128)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    disabled: bool = False
    models: list[str] | None = None
    quota: QuotaLimits | None = None

    @field_validator("sha256")
    @classmethod
    def _lower(cls, value: str) -> str:
        return value.lower()


class TenantSettings(_Section):
    """A tenant: its API keys, the models it may use (None = all served), its quota and its
    admission priority (higher is served first from the admission queue)."""

    name: str = Field(min_length=1, max_length=128)
    keys: list[ApiKeySettings] = Field(min_length=1)
    models: list[str] | None = None
    priority: int = Field(default=0, ge=0, le=100)
    quota: QuotaLimits = Field(default_factory=QuotaLimits)


class QuotaSettings(_Section):
    """Where quota state lives and what happens when that store fails.

    `backend`: "memory" (this process only) or "redis" (shared by every instance using the
    same `redis_url` and `key_prefix`). `on_store_error`: "fail_closed" answers 503,
    "fail_open" admits without counting; either way a metric and a log line.
    `store_timeout_s`: per store call. `window_s`: the sliding window of the per-minute
    limits. `stream_lease_s`: a stream slot's lease, renewed every third of it while the
    request runs, so a crashed instance's slots free themselves after at most this long.
    `streams_retry_after_s`: the `Retry-After` given when only the stream limit is hit
    (when a stream ends is unknown). `default_completion_reservation`: tokens reserved for
    the completion of a request that sets no `max_tokens` (capped at the room its context
    leaves); the engine's real count is charged at the end either way.
    """

    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="homing", min_length=1)
    on_store_error: Literal["fail_closed", "fail_open"] = "fail_closed"
    store_timeout_s: float = Field(default=0.5, gt=0)
    window_s: float = Field(default=60.0, gt=0)
    stream_lease_s: float = Field(default=30.0, gt=0)
    streams_retry_after_s: int = Field(default=1, ge=1)
    default_completion_reservation: int = Field(default=1024, ge=1)


class AdmissionSettings(_Section):
    """The per-model admission queue used when every healthy replica is overloaded.

    A replica running nothing with none of our requests in flight is never overloaded.
    Otherwise it is overloaded at the router's `max_waiting` queue, at KV utilisation >= the
    router's `max_token_usage` while it queues or its admission window is full, when its
    load reaches the engine's `max_running_requests`, or (when set) when its load reaches
    `max_in_flight_per_replica`. `max_queued` waiting requests at most (0 = no queue: 503 at
    once); while other tenants also wait, one tenant may hold `max_queued_per_tenant` (None
    = a quarter, at least 1), but a tenant alone may use the whole queue. A full queue gives
    a higher-priority arrival the place of the newest lowest-priority waiter (which gets the
    503). A request waits at most `queue_timeout_s` seconds, and that wait counts against
    `gateway.request_timeout_s` (the engine gets what is left). Rejections are 503 with
    `Retry-After: retry_after_s` (seconds).
    """

    enabled: bool = True
    # Defaults keep an overloaded but otherwise healthy pool lossless: a request may wait as
    # long as its whole generation may run (`gateway.request_timeout_s`, 600 s).
    max_queued: int = Field(default=1024, ge=0)
    max_queued_per_tenant: int | None = Field(default=None, ge=1)
    queue_timeout_s: float = Field(default=600.0, gt=0)
    max_in_flight_per_replica: int | None = Field(default=None, ge=1)
    retry_after_s: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _per_tenant(self) -> AdmissionSettings:
        cap = self.max_queued_per_tenant
        if cap is not None and self.max_queued > 0 and cap > self.max_queued:
            raise ValueError("max_queued_per_tenant must not exceed max_queued")
        return self

    @property
    def tenant_cap(self) -> int:
        """Waiting requests one tenant may hold."""
        if self.max_queued_per_tenant is not None:
            return self.max_queued_per_tenant
        return max(1, self.max_queued // 4)


class DaemonSettings(_Section):
    """Running as a service (`homing.daemon`).

    `min_ready_workers`: ready workers each model needs before the service tells systemd
    it is ready (READY=1); the start fails after `engines.startup_timeout_s` without them.
    `stall_threshold_s`: an event-loop stall longer than this is logged with the stack of
    what blocked it (0 turns the report off); 1 s is ~100x a healthy loop's longest
    callback. `status_interval_s`: how often the STATUS line `systemctl status` shows is
    renewed.
    """

    min_ready_workers: int = Field(default=1, ge=1, le=1024, strict=True)
    stall_threshold_s: float = Field(default=1.0, ge=0, le=3600, allow_inf_nan=False)
    status_interval_s: float = Field(default=5.0, gt=0, le=3600, allow_inf_nan=False)


class HomingConfig(_Section):
    """The whole configuration of one `homing serve` process."""

    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    engines: EngineSettings = Field(default_factory=EngineSettings)
    sim: SimSettings = Field(default_factory=SimSettings)
    sglang: SglangSettings = Field(default_factory=SglangSettings)
    # No tenants (the embedded default): authentication and quotas are off.
    tenants: list[TenantSettings] = Field(default_factory=list)
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    # Several served models; empty: one model from `engines` / `sim` / `sglang`.
    models: list[ModelSettings] = Field(default_factory=list)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    # The SLO of every model without its own (`[[models]] slo`).
    slo: SloSettings = Field(default_factory=SloSettings)
    obs: ObsSettings = Field(default_factory=ObsSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    # The autoscaler of every model without its own (`[[models]] scaler`); off by default.
    scaler: ScalerSettings = Field(default_factory=ScalerSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)

    @model_validator(mode="after")
    def _models(self) -> HomingConfig:
        if self.models and self.engines.workers:
            raise ValueError("list workers under [[models]] or engines.workers, not both")
        if self.models and self.engines.launch == "sglang":
            raise ValueError('[[models]] serves simulated or listed workers, not launch "sglang"')
        names = [m.name for m in self.models if m.name is not None]
        if len(set(names)) != len(names):
            raise ValueError("two [[models]] have the same name")
        if len(self.models) > 1 and len(names) != len(self.models):
            raise ValueError("with several [[models]], each needs a name")
        urls = [url for m in self.models for url, _ in m.worker_specs()]
        if len(set(urls)) != len(urls):
            raise ValueError("a worker URL is listed twice")
        for m in self.models:
            if m.scaler is not None and m.scaler.gpu_budget is not None:
                raise ValueError("gpu_budget is for all pools together: set it in [scaler]")
        for m in self.served_models():
            scaler = self.scaler_of(m)
            if (
                scaler.enabled
                and scaler.scale_to_zero
                and not (self.admission.enabled and self.admission.max_queued > 0)
            ):
                raise ValueError(
                    "scaler.scale_to_zero holds requests in the admission queue while a "
                    "replica starts: it needs admission.enabled and admission.max_queued > 0"
                )
            if scaler.enabled and scaler.actuator == "local" and m.workers:
                raise ValueError(
                    'scaler.actuator = "local" starts the model\'s own workers; a model with '
                    'listed workers needs actuator "exec" or "kubernetes"'
                )
        self._check_gpu_budget()
        return self

    def _check_gpu_budget(self) -> None:
        """ValueError when `scaler.gpu_budget` cannot hold every autoscaled pool's
        min_replicas x gpus_per_replica (the budget could never be met)."""
        budget = self.scaler.gpu_budget
        if budget is None:
            return
        from homing.scaler.settings import gpus_per_replica

        floor = 0
        for m in self.served_models():
            scaler = self.scaler_of(m)
            if scaler.enabled:
                floor += scaler.min_replicas * gpus_per_replica(scaler, self.launched_sim(m))
        if floor > budget:
            raise ValueError(
                f"scaler.gpu_budget ({budget} GPUs) is below what the autoscaled pools' "
                f"min_replicas x gpus_per_replica hold ({floor} GPUs)"
            )

    def launched_sim(self, model: ModelSettings) -> SimSettings | None:
        """The simulated workers homing launches for `model` (None: it lists its workers, or
        homing launches real engines)."""
        return model.sim if not model.workers and self.engines.launch == "sim" else None

    def scaler_of(self, model: ModelSettings) -> ScalerSettings:
        """The autoscaler settings of `model`: its own, else `[scaler]`."""
        return model.scaler if model.scaler is not None else self.scaler

    def served_models(self) -> list[ModelSettings]:
        """The models to serve: `models`, or the one model `engines` / `sim` describe."""
        if self.models:
            out = []
            for m in self.models:
                if not m.workers:
                    # Default fleet: the top-level `sim` with the model's name as its preset.
                    sim = m.sim or self.sim.model_copy(update={"model": m.name or self.sim.model})
                    if m.name is not None and m.name != sim.model:
                        sim = sim.model_copy(update={"served_model_name": m.name})
                    m = m.model_copy(update={"sim": sim})
                out.append(m)
            return out
        return [
            ModelSettings(
                workers=list(self.engines.workers),
                sim=None if self.engines.workers else self.sim,
                tokenizer_path=self.engines.tokenizer_path,
                stream_interval=self.engines.stream_interval,
                max_stream_interval=self.engines.max_stream_interval,
            )
        ]

    @model_validator(mode="after")
    def _sglang_model(self) -> HomingConfig:
        if self.embedded and self.engines.launch == "sglang":
            if not self.sglang.model_path:
                raise ValueError('engines.launch = "sglang" needs sglang.model_path (--model)')
            from homing.engines.sglang_launch import check_model_dir

            check_model_dir(self.sglang.model_path)
        return self

    @model_validator(mode="after")
    def _unique_tenants_and_keys(self) -> HomingConfig:
        names: set[str] = set()
        key_ids: set[str] = set()
        hashes: set[str] = set()
        for tenant in self.tenants:
            if tenant.name in names:
                raise ValueError(f"tenant {tenant.name!r} is defined twice")
            names.add(tenant.name)
            for key in tenant.keys:
                if key.id in key_ids:
                    raise ValueError(f"API key id {key.id!r} is used twice")
                if key.sha256 in hashes:
                    raise ValueError(f"API key {key.id!r} has the same hash as another key")
                key_ids.add(key.id)
                hashes.add(key.sha256)
        return self

    @property
    def embedded(self) -> bool:
        """True when no workers are configured, so homing starts its own (simulated or
        SGLang, per `engines.launch`)."""
        return not self.engines.workers


class ConfigError(Exception):
    """A configuration file that cannot be read or does not validate."""


#: The largest configuration file read, bytes (a bigger one is refused unread).
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_config_text(path: str | Path) -> str:
    """The text of the configuration file at `path`: a regular file of at most
    `MAX_CONFIG_BYTES`, UTF-8. Never blocks on a FIFO or reads an endless device. Raises
    `ConfigError` ("PATH: why") otherwise, or when it cannot be opened or read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{path}: not a regular file ({_file_kind(mode)})")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CONFIG_BYTES and (chunk := os.read(fd, MAX_CONFIG_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from err
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start} is invalid)") from None


def _file_kind(mode: int) -> str:
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), "not a file")


def load_config(path: str | Path | None) -> HomingConfig:
    """Read a TOML file (`read_config_text`) into `HomingConfig`; `None` gives the embedded
    default.

    Raises `ConfigError` with the file name and the first problem found: unreadable, not a
    regular file, over `MAX_CONFIG_BYTES`, not UTF-8, not TOML, nested too deeply, invalid.
    """
    if path is None:
        return HomingConfig()
    text = read_config_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: {err}") from err
    except ValueError as err:  # an integer of more digits than Python converts
        raise ConfigError(f"{path}: {str(err).partition(';')[0]}") from err
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read") from None
    try:
        return HomingConfig.model_validate(data)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read") from None
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        if not where:  # a rule across sections: its message names them
            raise ConfigError(f"{path}: {first['msg'].removeprefix('Value error, ')}") from err
        raise ConfigError(f"{path}: {where}: {first['msg']}") from err
