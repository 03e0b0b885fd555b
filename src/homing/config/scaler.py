"""The autoscaler (`[scaler]`, `[[models]] scaler`): its rules' settings, its actuators
(`[scaler.exec]`, `[scaler.kubernetes]`) and the GPUs one replica holds."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from homing.config.base import Seconds, Section
from homing.config.engines import SimSettings
from homing.config.rules import check_command_template
from homing.sim.timing import model_spec


class ExecActuatorSettings(Section):
    """The `exec` actuator (`[scaler.exec]`): `command` is called with `scale N` (the desired
    replica count) and `list`, and prints its members, one `<id> <grpc://host:port or ->` per
    line (homing.scaler.actuators.exec); `list` every `poll_s` (0.1 to 3600 s), each call
    at most `timeout_s`."""

    command: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    poll_s: float = Field(default=2.0, ge=0.1, le=3600, allow_inf_nan=False, strict=True)
    timeout_s: Seconds = 60.0


#: A Kubernetes namespace (an RFC 1123 label) and an object name (an RFC 1123 subdomain), as
#: the API server validates them.
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class KubernetesActuatorSettings(Section):
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


class ScalerSettings(Section):
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
    scale_down_window_s: Seconds = 120.0
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
    default_cold_start_s: Seconds = 60.0
    scale_to_zero: bool = Field(default=False, strict=True)
    idle_to_zero_s: Seconds = 300.0
    gpus_per_replica: int | None = Field(default=None, ge=1, le=1024, strict=True)
    gpu_budget: int | None = Field(default=None, ge=1, strict=True)
    decode_streams_per_replica: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, strict=True
    )
    prefill_tokens_per_s_per_replica: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, strict=True
    )
    startup_timeout_s: Seconds = 300.0
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
            check_command_template(list(self.command))  # ValueError naming what is wrong
        return self


def gpus_per_replica(settings: ScalerSettings, sim: SimSettings | None) -> int:
    """GPUs one replica holds: the section's figure, else the sim preset's TP, else 1."""
    if settings.gpus_per_replica is not None:
        return settings.gpus_per_replica
    if sim is not None:
        if sim.tp is not None:
            return sim.tp
        try:
            return model_spec(sim.model).default_tp
        except ValueError:
            return 1
    return 1
