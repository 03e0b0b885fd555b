"""The whole configuration of one `homing serve` process (`HomingConfig`) and its rules
across sections, with the observability (`[obs]`) and service (`[daemon]`) tables."""

from __future__ import annotations

from pydantic import Field, model_validator

from homing.config.admin import AdminSettings
from homing.config.base import Section
from homing.config.engines import EngineSettings, SglangSettings, SimSettings
from homing.config.gateway import AdmissionSettings, GatewaySettings
from homing.config.models import ModelSettings, RolloutSettings, SloSettings
from homing.config.router import RouterSettings
from homing.config.rules import check_model_dir
from homing.config.scaler import ScalerSettings, gpus_per_replica
from homing.config.tenants import QuotaSettings, TenantSettings


class ObsSettings(Section):
    """Observability (`[obs]`). `request_metrics`: the per-request series on `/metrics`
    (off: the log line, SLO gauges and worker snapshots only). `tenant_labels`: add a
    `tenant` label to the request series (off by default: one series set per worker,
    whatever the number of tenants)."""

    request_metrics: bool = Field(default=True, strict=True)
    tenant_labels: bool = Field(default=False, strict=True)


class DaemonSettings(Section):
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


class HomingConfig(Section):
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
        self._check_processes()
        return self

    def _check_processes(self) -> None:
        """ValueError when several gateway processes could not follow the first one (no
        admin API)."""
        if self.gateway.processes == 1:
            return
        if not self.admin.enabled:
            raise ValueError(
                "gateway.processes > 1 needs admin.enabled: the other processes follow the "
                "first one's workers through its admin API"
            )
        if self.admin.socket == "":
            raise ValueError(
                'gateway.processes > 1 needs the admin socket (admin.socket = "" turns it '
                "off): the other processes follow the first one's workers through it"
            )

    def _check_gpu_budget(self) -> None:
        """ValueError when `scaler.gpu_budget` cannot hold every autoscaled pool's
        min_replicas x gpus_per_replica (the budget could never be met)."""
        budget = self.scaler.gpu_budget
        if budget is None:
            return
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
