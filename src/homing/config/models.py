"""A served model (`[[models]]`): its workers, version split, routing overrides, output
parsers, SLO (`[slo]`) and rollouts (`[rollout]`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from homing.config.base import Section
from homing.config.engines import MaxStreamInterval, SimSettings, StreamInterval, WorkerEntry
from homing.config.router import CostWeightSettings, RoutingPolicy
from homing.config.rules import (
    MAX_BAKE_S,
    VersionLabel,
    check_steps,
    check_version_label,
    check_version_weights,
    check_worker_url,
)
from homing.config.scaler import ScalerSettings
from homing.text.parsers import REASONING_PARSERS, TOOL_PARSERS


class SloSettings(Section):
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


class RolloutSettings(Section):
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
    bake_s: float = Field(default=600.0, ge=0, le=MAX_BAKE_S, allow_inf_nan=False)
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
        return check_steps(steps)


class ModelSettings(Section):
    """One served model (`[[models]]`): its pool of workers and how requests are routed.

    `name`: the served model name clients send and every worker must report (None: the
    first worker's). `workers`: its SGLang workers (`grpc://host:port` or tables with `url`
    and `version`); with none, homing starts its simulated fleet `sim` (default: the
    top-level `sim` section with `sim.model` = `name` when set). `version`: the default
    version label of its workers. `policy` and `weights`: routing overrides for this model
    (default `router.policy` and `router.weights`). `tokenizer_path`: a local tokenizer
    directory (default: the workers' GetTokenizer bundle). `stream_interval`: tokens per
    streamed chunk asked of the engine (SGLang's `stream_interval`; 1 asks nothing, so the
    workers' own `--stream-interval` applies, 1 by default), or "auto" (the default): from 1
    up to `max_stream_interval` (default 4) while the gateway's event loop is the bottleneck
    (homing.fleet.stream_interval); larger chunks cost the gateway less per token and make the
    client see tokens in bursts. The first token is never held back.
    `slo` / `scaler`: this model's SLO and autoscaler (default: the top-level sections).
    `versions`: the weighted split of its versions, version label -> weight (relative,
    percent in practice; homing.router.versions); a version left out gets no requests
    unless pinned. None: every ready worker takes requests, whatever its version.
    `tool_call_parser` / `reasoning_parser`: how its answers' tool calls and reasoning are
    parsed (names in `homing.config.rules`; "none" turns one off); None: the parser its
    chat template implies, if any.
    """

    name: str | None = Field(default=None, min_length=1, max_length=256)
    workers: list[str | WorkerEntry] = Field(default_factory=list)
    sim: SimSettings | None = None
    version: VersionLabel = ""
    policy: RoutingPolicy | None = None
    weights: CostWeightSettings | None = None
    tokenizer_path: str | None = None
    stream_interval: StreamInterval = "auto"
    max_stream_interval: MaxStreamInterval = 4
    slo: SloSettings | None = None
    scaler: ScalerSettings | None = None
    versions: dict[str, float] | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, name: str | None) -> str | None:
        if name is not None and name != "none" and name not in TOOL_PARSERS:
            known = ", ".join(sorted(TOOL_PARSERS))
            raise ValueError(f"unknown tool_call_parser {name!r} (known: none, {known})")
        return name

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, name: str | None) -> str | None:
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
        return check_version_weights(versions)

    @field_validator("workers")
    @classmethod
    def _urls(cls, workers: list[str | WorkerEntry]) -> list[str | WorkerEntry]:
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
