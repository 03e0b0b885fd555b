"""Typed configuration: a TOML file read into pydantic models; every default is the embedded one.

With no file, `homing serve` runs the embedded default: simulated workers started as child
processes (`sim`; `engines.launch = "sglang"` starts real SGLang ones, section `sglang`),
the gateway on 127.0.0.1:8080 (HTTP) and 127.0.0.1:50051 (gRPC).
A file that lists `engines.workers` (`grpc://host:port`) serves those SGLang workers instead.
Unknown keys are errors, so a typo in a config file is reported rather than ignored.

Modules, one per job: `gateway` (listeners, limits, admission), `tenants` (keys, quotas),
`router`, `engines` (workers, sim, sglang, probes), `scaler`, `models` (served models, SLO,
rollouts), `admin`, `root` (`HomingConfig`), `load` (reading a file), `base` (what sections
share) and `rules` (the value rules config shares with the subsystems). This package is the
lowest layer: it imports only the standard library, pydantic and leaf modules.
"""

from homing.config.admin import AdminKeySettings, AdminSettings, default_state_dir
from homing.config.engines import (
    BreakerSettings,
    EngineSettings,
    MaxStreamInterval,
    OutlierSettings,
    SglangSettings,
    SimSettings,
    StreamInterval,
    WorkerEntry,
)
from homing.config.gateway import AdmissionSettings, GatewaySettings
from homing.config.load import MAX_CONFIG_BYTES, ConfigError, load_config, read_config_text
from homing.config.models import ModelSettings, RolloutSettings, SloSettings
from homing.config.root import DaemonSettings, HomingConfig, ObsSettings
from homing.config.router import (
    CostWeightSettings,
    RouterModelSettings,
    RouterSettings,
    RoutingPolicy,
)
from homing.config.rules import check_version_label
from homing.config.scaler import (
    ExecActuatorSettings,
    KubernetesActuatorSettings,
    ScalerSettings,
    gpus_per_replica,
)
from homing.config.tenants import ApiKeySettings, QuotaLimits, QuotaSettings, TenantSettings

__all__ = [
    "MAX_CONFIG_BYTES",
    "AdminKeySettings",
    "AdminSettings",
    "AdmissionSettings",
    "ApiKeySettings",
    "BreakerSettings",
    "ConfigError",
    "CostWeightSettings",
    "DaemonSettings",
    "EngineSettings",
    "ExecActuatorSettings",
    "GatewaySettings",
    "HomingConfig",
    "KubernetesActuatorSettings",
    "MaxStreamInterval",
    "ModelSettings",
    "ObsSettings",
    "OutlierSettings",
    "QuotaLimits",
    "QuotaSettings",
    "RolloutSettings",
    "RouterModelSettings",
    "RouterSettings",
    "RoutingPolicy",
    "ScalerSettings",
    "SglangSettings",
    "SimSettings",
    "SloSettings",
    "StreamInterval",
    "TenantSettings",
    "WorkerEntry",
    "check_version_label",
    "default_state_dir",
    "gpus_per_replica",
    "load_config",
    "read_config_text",
]
