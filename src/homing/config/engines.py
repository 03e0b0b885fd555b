"""The engines: the workers to serve or start (`[engines]`, `[sim]`, `[sglang]`), how they
are probed, ejected as outliers and guarded by a circuit breaker, and how many tokens each
streamed chunk carries."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from homing.config.base import Seconds, Section
from homing.config.rules import VersionLabel, check_worker_url

_INT32_MAX = 2**31 - 1  # SGLang's SamplingParams.stream_interval is an int32


def _stream_interval(value: object) -> object:
    if value == "auto" or (type(value) is int and 1 <= value <= _INT32_MAX):
        return value
    raise ValueError(f'must be an integer from 1 to {_INT32_MAX} or "auto", got {value!r}')


# Tokens per streamed chunk sent to the engine (SGLang `SamplingParams.stream_interval`): a
# fixed count, or "auto" (homing.fleet.stream_interval) up to `max_stream_interval`.
StreamInterval = Annotated[int | Literal["auto"], BeforeValidator(_stream_interval)]
MaxStreamInterval = Annotated[int, Field(ge=1, le=_INT32_MAX, strict=True)]


class OutlierSettings(Section):
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
    interval_s: Seconds = 5.0
    window_s: Seconds = 15.0
    factor: float = Field(default=3.0, gt=1, allow_inf_nan=False, strict=True)
    consecutive: int = Field(default=2, ge=1, strict=True)
    min_requests: int = Field(default=5, ge=1, strict=True)
    min_uncached_tokens: int = Field(default=256, ge=0, strict=True)
    error_ratio: float = Field(default=0.5, gt=0, le=1, strict=True)
    base_ejection_s: Seconds = 10.0
    max_ejection_s: Seconds = 300.0
    max_ejected_fraction: float = Field(default=0.5, gt=0, le=1, strict=True)
    probe_timeout_s: Seconds = 10.0

    @model_validator(mode="after")
    def _ordered(self) -> OutlierSettings:
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError("max_ejection_s must be at least base_ejection_s")
        if self.window_s > 60.0:
            raise ValueError("window_s must be at most 60 (the request records kept)")
        return self


class BreakerSettings(Section):
    """The per-worker circuit breaker (`[engines.breaker]`; homing.engines.breaker):
    `consecutive` transport failures of requests open it; after `open_s` (doubling on each
    re-open, up to `max_open_s`) one trial request is let through, whose success closes it."""

    enabled: bool = Field(default=True, strict=True)
    consecutive: int = Field(default=5, ge=1, strict=True)
    open_s: Seconds = 1.0
    max_open_s: Seconds = 30.0

    @model_validator(mode="after")
    def _ordered(self) -> BreakerSettings:
        if self.max_open_s < self.open_s:
            raise ValueError("max_open_s must be at least open_s")
        return self


class EngineSettings(Section):
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
    stream_interval: StreamInterval = "auto"
    max_stream_interval: MaxStreamInterval = 4
    progress_window_s: Seconds = 5.0
    outliers: OutlierSettings = Field(default_factory=OutlierSettings)
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)

    @field_validator("workers")
    @classmethod
    def _grpc_urls(cls, urls: list[str]) -> list[str]:
        return [check_worker_url(url) for url in urls]


class SimSettings(Section):
    """The embedded default: simulated SGLang workers started as child processes."""

    workers: int = Field(default=2, ge=1, le=64)
    model: str = "llama-3.1-8b"
    gpu: str = "H100"
    tp: int | None = Field(default=None, ge=1)  # None: the preset's TP (8 for 70b)
    speedup: float = Field(default=1.0, gt=0)
    extra_args: list[str] = Field(default_factory=list)
    served_model_name: str | None = None  # None: the preset's name (`model`)


class SglangSettings(Section):
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


class WorkerEntry(Section):
    """A configured worker: its `grpc://host:port` URL and `version` label (engine or
    weights revision; default the model's `version`)."""

    url: str
    version: VersionLabel | None = None

    @field_validator("url")
    @classmethod
    def _grpc_url(cls, url: str) -> str:
        return check_worker_url(url)
