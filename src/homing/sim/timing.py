"""Timing model of one SGLang worker (model x GPU x TP): how long a scheduler step takes.

Rule of this file: pure arithmetic over published hardware and model figures; every constant
names its source. No clock, no I/O; the optional jitter draws from a `random.Random` the caller
passes in.

A scheduler step runs a batch that mixes prefill chunks (compute-bound) and decode tokens
(memory-bound). Its time is a roofline of the whole batch plus the costs a roofline misses:

    step_s     = max(compute_s, memory_s) + allreduce_s + overhead_s
    compute_s  = FLOPs / (tp x peak_bf16_dense_flops x prefill_mfu)
    memory_s   = weight_bytes / (tp x hbm_bandwidth x weight_bandwidth_efficiency)
               + kv_bytes_read / (tp x hbm_bandwidth x attention_bandwidth_efficiency)
    allreduce_s = 2 x layers x (allreduce_latency_s + message x 2 (tp - 1) / tp / busbw)
                  (tp > 1 only; two all-reduces per layer, Shoeybi et al. 2019, "Megatron-LM",
                  sec. 3; NCCL's bus-bandwidth convention for the size term)
    overhead_s = step_overhead_s + seq_layer_overhead_s x layers x sequences in the batch

FLOPs (the usual dense-transformer count, Kaplan et al. 2020, "Scaling Laws", sec. 2.1; Chowdhery
et al. 2022, "PaLM", appendix B for the attention term):
    - 2 x params per token processed (prefill new tokens and decode tokens);
    - attention: 4 x layers x (heads x head_dim) per (query, key) pair; a prefill chunk of n new
      tokens after c cached ones has n x c + n (n + 1) / 2 pairs (causal), a decode token at
      context ctx has ctx pairs.

Bytes moved per step (decode is bandwidth-bound, Pope et al. 2022, "Efficiently Scaling
Transformer Inference", sec. 2): the weights once (2 bytes/param, bf16) plus the KV cache of
every sequence in the batch (context tokens x kv_bytes_per_token, where kv_bytes_per_token =
2 (K and V) x layers x kv_heads x head_dim x 2 bytes).

Why a pure roofline is not enough (calibration, see `TimingParams` for each constant):
- weights stream at ~60% of HBM peak in real decode steps, not 100%: vLLM's nightly latency
  benchmark (buildkite vllm/performance-benchmark, batch 8, 32 in / 128 out, H200) takes
  833 ms for llama-3.1-8b TP1 (6.5 ms per step; weights alone at peak: 3.3 ms) and 2,078 ms for
  llama-3-70b TP4 (16.2 ms per step; weights at peak: 7.3 ms); NVIDIA NIM's published
  llama-3.3-70b FP8 TP2 on 2x H100 runs 18.6 ms per token at concurrency 1 (weights at peak:
  10.5 ms). All three give 55-60% achieved bandwidth once fixed costs are taken out;
- every decode step pays per-layer latencies that do not shrink with bandwidth: at TP8 two
  all-reduces per layer (160 for a 70B model) at ~20 us each on NVLink for decode-sized
  messages (NCCL all_reduce_perf latency floor on 8x H100), and per (sequence, layer) work that
  is not weight streaming -- paged decode attention over 16-token pages (page-table walk,
  split-KV merge), the KV write, RoPE and norms for the new token, logits and sampling, and
  host-side batch bookkeeping that overlap scheduling does not fully hide (vLLM v0.6.0
  performance blog, 2024-09-05: in v0.5.3 only 38% of a llama-3-8b H100 serving step was GPU
  time). A pure roofline (peak bandwidth) puts llama-3.1-70b TP8 on H100 at ~8 ms for a decode
  step of batch 80 x 1,800 tokens, ~17 ms with the achieved bandwidths and all-reduce latency
  above, but production serving stacks are slower than that: NIM's llama-3.3-70b FP8 TP2
  inter-token latency doubles from 18.6 ms at concurrency 1 to 38.8 ms at concurrency 25 with
  5,000-token prompts; the extra KV bytes account for ~6 ms of that at peak bandwidth, the rest
  is chunked-prefill interference and per-request work (the latter is what
  `seq_layer_overhead_s` charges).
  `seq_layer_overhead_s` is fitted so the 70B TP8 H100 step at batch 80 x 1,800 tokens is
  ~43 ms and a chat workload's p95 TPOT crosses 50 ms at a running batch of ~85, the seed's
  planning figure for 8x H100 (p95 TPOT 50 ms at a running batch of 64-96;
  docs/architecture.md, "The sizing chain"); with it the two vLLM H200 points above come out
  at +9% (7.1 ms) and +15% (18.6 ms), and the 8B TP1 H100 step at batch 8 x 2,000 tokens at
  ~11 ms.

KV pool capacity follows SGLang's memory split: GPU memory x tp x mem_fraction_static, minus
the weights, divided by KV bytes per token.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------
# Hardware and model figures
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's published figures.

    memory_bytes: HBM capacity as the driver reports it (bytes).
    peak_bf16_flops: dense BF16 tensor-core peak (FLOP/s, no sparsity).
    hbm_bandwidth: HBM bandwidth (bytes/s).
    allreduce_busbw: NCCL all-reduce bus bandwidth achieved over NVLink (bytes/s).
    """

    name: str
    memory_bytes: int
    peak_bf16_flops: float
    hbm_bandwidth: float
    allreduce_busbw: float


# NVIDIA H100 SXM5 datasheet: 80 GB HBM3 (nvidia-smi: 81559 MiB), 989.4 TFLOPS dense BF16
# (1,979 with sparsity), 3.35 TB/s; NVLink 4 900 GB/s bidirectional. NCCL all_reduce_perf on
# 8x H100 NVLink reaches ~360-480 GB/s bus bandwidth for large messages; we take 360 GB/s.
H100 = GpuSpec(
    name="H100",
    memory_bytes=81559 * 2**20,
    peak_bf16_flops=989.4e12,
    hbm_bandwidth=3.35e12,
    allreduce_busbw=360e9,
)

# NVIDIA H200 SXM datasheet: 141 GB HBM3e (nvidia-smi: 143771 MiB), 989.4 TFLOPS dense BF16,
# 4.8 TB/s; same NVLink 4 fabric as H100.
H200 = GpuSpec(
    name="H200",
    memory_bytes=143771 * 2**20,
    peak_bf16_flops=989.4e12,
    hbm_bandwidth=4.8e12,
    allreduce_busbw=360e9,
)

GPUS: dict[str, GpuSpec] = {"H100": H100, "H200": H200}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (from its Hugging Face config.json).

    num_params: total parameters; weights are bf16 (2 bytes each).
    hf_path: the model_path a real SGLang worker would report.
    default_gpu / default_tp: the hardware preset `homing sim --model NAME` uses.
    """

    name: str
    hf_path: str
    num_params: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_context_length: int
    default_gpu: str
    default_tp: int

    @property
    def weight_bytes(self) -> int:
        """bf16 weights: 2 bytes x params."""
        return 2 * self.num_params

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K, V) x layers x kv_heads x head_dim x 2 bytes (bf16)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

    @property
    def attention_width(self) -> int:
        """Query heads x head_dim (the width of QK^T and AV per layer)."""
        return self.num_attention_heads * self.head_dim


# meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
# head_dim 128, 131072 context; 8,030,261,248 parameters (model card).
LLAMA_31_8B = ModelSpec(
    name="llama-3.1-8b",
    hf_path="meta-llama/Llama-3.1-8B-Instruct",
    num_params=8_030_261_248,
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    max_context_length=131072,
    default_gpu="H100",
    default_tp=1,
)

# meta-llama/Llama-3.1-70B-Instruct config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads,
# head_dim 128, 131072 context; 70,553,706,496 parameters (model card).
LLAMA_31_70B = ModelSpec(
    name="llama-3.1-70b",
    hf_path="meta-llama/Llama-3.1-70B-Instruct",
    num_params=70_553_706_496,
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=128,
    max_context_length=131072,
    default_gpu="H100",
    default_tp=8,
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in (LLAMA_31_8B, LLAMA_31_70B)}

PRESETS: tuple[tuple[str, str, int], ...] = (
    ("llama-3.1-8b", "H100", 1),
    ("llama-3.1-8b", "H200", 1),
    ("llama-3.1-70b", "H100", 8),
    ("llama-3.1-70b", "H200", 8),
    ("llama-3.1-70b", "H100", 4),
    ("llama-3.1-70b", "H200", 4),
)
"""The calibrated (model, GPU, TP) combinations; any other TP that fits the weights also runs."""


@dataclass(frozen=True)
class TimingParams:
    """Efficiency constants of the step model (dimensionless unless stated; sources in the
    module docstring).

    prefill_mfu: achieved share of dense BF16 peak in GEMM-heavy steps. 0.40 is the usual
        figure for large-batch bf16 transformer forward passes on H100 (the Llama 3 paper,
        Dubey et al. 2024, Table 4, reports 38-43% BF16 MFU). Compute alone at this MFU would
        put llama-3.1-70b on 8x H100 at ~20.9k prefill tokens/s at 8k tokens; the two
        all-reduces per layer, charged without overlap, take ~21% of that step and bring it to
        ~16.3k (issue 3's calibration band is 14k-20k).
    weight_bandwidth_efficiency: achieved share of HBM bandwidth while streaming the weights
        in a decode step; 0.60 from vLLM's H200 latency benchmark and NIM's H100 figures
        (55-60% once fixed costs are taken out).
    attention_bandwidth_efficiency: achieved share of HBM bandwidth reading the paged KV
        cache in decode attention (16-token pages, GQA); 0.50.
    allreduce_latency_s: fixed cost of one all-reduce on NVLink at decode message sizes (s);
        20 us, the latency floor of NCCL all_reduce_perf on 8x H100.
    step_overhead_s: fixed cost per scheduler step (s): scheduling, CUDA-graph launch and
        the step's synchronisation; 0.5 ms.
    seq_layer_overhead_s: cost per (sequence in the batch, layer) beyond the roofline (s):
        paged-attention per-request work, KV write, RoPE and norms for the new token, logits,
        sampling and host bookkeeping; 4.0 us, fitted to the seed's 8x H100 planning figure
        (70B TP8 decode step at batch 80 x 1,800 tokens ~43 ms).
    """

    prefill_mfu: float = 0.40
    weight_bandwidth_efficiency: float = 0.60
    attention_bandwidth_efficiency: float = 0.50
    allreduce_latency_s: float = 20e-6
    step_overhead_s: float = 0.5e-3
    seq_layer_overhead_s: float = 4.0e-6


# --------------------------------------------------------------------------------------------
# Step cost
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillChunk:
    """One request's prefill work in a step: `new_tokens` computed after `cached_tokens`
    already in the KV cache (prefix-cache hit or earlier chunks)."""

    new_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class StepCost:
    """A step's time split (seconds); `total_s` = max(compute, memory) + allreduce + overhead."""

    compute_s: float
    memory_s: float
    allreduce_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.allreduce_s + self.overhead_s


class TimingModel:
    """Step durations for one model on `tp` GPUs of one kind (see the module docstring).

    Raises ValueError when tp < 1.
    """

    def __init__(
        self, model: ModelSpec, gpu: GpuSpec, tp: int = 1, params: TimingParams | None = None
    ) -> None:
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        self.model = model
        self.gpu = gpu
        self.tp = tp
        self.params = params or TimingParams()

    @classmethod
    def from_names(cls, model: str, gpu: str, tp: int) -> TimingModel:
        """Look up presets by name; raises ValueError for an unknown model or GPU."""
        return cls(model_spec(model), gpu_spec(gpu), tp)

    # ---- sizes ----

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache per token across all TP ranks."""
        return self.model.kv_bytes_per_token

    def kv_capacity_tokens(self, mem_fraction_static: float | None = None) -> int:
        """KV pool size in tokens: (GPU memory x tp x mem_fraction_static - weights) / KV bytes
        per token. `None` takes SGLang's default fraction for this TP degree.

        Raises ValueError when the weights do not fit.
        """
        fraction = mem_fraction_static or default_mem_fraction_static(self.tp)
        pool_bytes = self.gpu.memory_bytes * self.tp * fraction - self.model.weight_bytes
        tokens = int(pool_bytes // self.kv_bytes_per_token)
        if tokens <= 0:
            raise ValueError(
                f"{self.model.name} weights ({self.model.weight_bytes / 1e9:.0f} GB) do not fit "
                f"in {self.tp} x {self.gpu.name} at mem_fraction_static={fraction}; "
                f"use a larger --tp (preset: {self.model.default_tp})"
            )
        return tokens

    # ---- cost ----

    def step_cost(
        self,
        prefill: Sequence[PrefillChunk] = (),
        decode_batch: int = 0,
        decode_context_tokens: int = 0,
    ) -> StepCost:
        """Cost of one step running `prefill` chunks plus `decode_batch` decode tokens whose
        contexts sum to `decode_context_tokens` (see the module docstring). An empty step
        costs 0."""
        m, p = self.model, self.params
        new_tokens = 0
        attn_pairs = decode_context_tokens
        kv_read_tokens = decode_context_tokens
        for chunk in prefill:
            n, c = chunk.new_tokens, chunk.cached_tokens
            new_tokens += n
            attn_pairs += n * c + n * (n + 1) // 2
            kv_read_tokens += c + n
        tokens = new_tokens + decode_batch
        if tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0)
        flops = 2.0 * m.num_params * tokens + 4.0 * m.num_layers * m.attention_width * attn_pairs
        compute_s = flops / (self.tp * self.gpu.peak_bf16_flops * p.prefill_mfu)
        bandwidth = self.tp * self.gpu.hbm_bandwidth
        memory_s = m.weight_bytes / (bandwidth * p.weight_bandwidth_efficiency) + (
            kv_read_tokens * m.kv_bytes_per_token
        ) / (bandwidth * p.attention_bandwidth_efficiency)
        allreduce_s = 0.0
        if self.tp > 1:
            calls = 2 * m.num_layers
            size = tokens * m.hidden_size * 2
            ring = 2.0 * (self.tp - 1) / self.tp
            allreduce_s = calls * (p.allreduce_latency_s + size * ring / self.gpu.allreduce_busbw)
        sequences = decode_batch + len(prefill)
        overhead_s = p.step_overhead_s + p.seq_layer_overhead_s * m.num_layers * sequences
        return StepCost(compute_s, memory_s, allreduce_s, overhead_s)

    def step_time_s(
        self,
        prefill: Sequence[PrefillChunk] = (),
        decode_batch: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """Seconds for one step (see `step_cost`)."""
        return self.step_cost(prefill, decode_batch, decode_context_tokens).total_s

    def prefill_time_s(
        self, new_tokens: int, cached_tokens: int = 0, chunk_tokens: int | None = None
    ) -> float:
        """Seconds to prefill `new_tokens` after `cached_tokens`, alone on the worker: one step,
        or steps of at most `chunk_tokens` new tokens each (SGLang's chunked prefill) when
        given. Raises ValueError when chunk_tokens < 1."""
        if chunk_tokens is None:
            return self.step_time_s([PrefillChunk(new_tokens, cached_tokens)])
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        total, done = 0.0, 0
        while done < new_tokens:
            size = min(chunk_tokens, new_tokens - done)
            total += self.step_time_s([PrefillChunk(size, cached_tokens + done)])
            done += size
        return total

    def decode_step_time_s(self, batch: int, context_tokens: int) -> float:
        """Seconds for a decode-only step of `batch` sequences of `context_tokens` each."""
        return self.step_time_s(decode_batch=batch, decode_context_tokens=batch * context_tokens)


class JitteredTimer:
    """A `TimingModel` whose step times are scaled by a uniform factor in [1 - jitter,
    1 + jitter], drawn from the `rng` the caller owns (seed it for reproducible runs).

    Raises ValueError unless 0 <= jitter < 1.
    """

    def __init__(self, timing: TimingModel, jitter: float, rng: random.Random) -> None:
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        self.timing = timing
        self.jitter = jitter
        self._rng = rng

    def step_time_s(
        self,
        prefill: Sequence[PrefillChunk] = (),
        decode_batch: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """The model's step time times 1 + U(-jitter, jitter)."""
        base = self.timing.step_time_s(prefill, decode_batch, decode_context_tokens)
        if self.jitter == 0.0 or base == 0.0:
            return base
        return base * (1.0 + self._rng.uniform(-self.jitter, self.jitter))


class InstantTimer:
    """A step timer for which every step takes zero seconds (`SimConfig.instant`)."""

    def step_time_s(
        self,
        prefill: Sequence[PrefillChunk] = (),
        decode_batch: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """Always 0.0."""
        return 0.0


# --------------------------------------------------------------------------------------------
# Presets and derived limits
# --------------------------------------------------------------------------------------------


def model_spec(name: str) -> ModelSpec:
    """The preset model `name`; raises ValueError listing the known ones."""
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def gpu_spec(name: str) -> GpuSpec:
    """The preset GPU `name` (case-insensitive); raises ValueError listing the known ones."""
    try:
        return GPUS[name.upper()]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}") from None


def default_mem_fraction_static(tp: int) -> float:
    """SGLang's default `mem_fraction_static` by TP degree (server_args.py, v0.4 table):
    0.88 at TP1, 0.87 at TP2, 0.85 at TP4, 0.81 at TP8, 0.79 at TP16+."""
    if tp >= 16:
        return 0.79
    if tp >= 8:
        return 0.81
    if tp >= 4:
        return 0.85
    if tp >= 2:
        return 0.87
    return 0.88


def default_max_running_requests(kv_capacity_tokens: int, context_length: int) -> int:
    """SGLang's derived admission window: the request-slot pool
    min(max(kv_tokens / context_len x 512, 2048), 4096), capped at kv_tokens / 2
    (model_runner.py / scheduler.py, v0.4)."""
    slots = min(max(int(kv_capacity_tokens / context_length * 512), 2048), 4096)
    return max(1, min(slots, kv_capacity_tokens // 2))


@dataclass(frozen=True)
class EngineLimits:
    """A worker's resolved limits: KV pool size (tokens, a multiple of page_size), admission
    window, context window, and the memory fraction they came from."""

    kv_capacity_tokens: int
    max_running_requests: int
    max_context_length: int
    mem_fraction_static: float


def resolve_limits(
    timing: TimingModel,
    *,
    page_size: int,
    kv_capacity_tokens: int | None = None,
    max_running_requests: int | None = None,
    max_context_length: int | None = None,
    mem_fraction_static: float | None = None,
) -> EngineLimits:
    """Fill the `None`s from the preset; raises ValueError when the pool is under one page."""
    fraction = mem_fraction_static or default_mem_fraction_static(timing.tp)
    kv = kv_capacity_tokens or timing.kv_capacity_tokens(fraction)
    kv = kv // page_size * page_size
    if kv < page_size:
        raise ValueError(f"KV pool of {kv} tokens is smaller than one page ({page_size})")
    context = max_context_length or timing.model.max_context_length
    running = max_running_requests or default_max_running_requests(kv, context)
    return EngineLimits(
        kv_capacity_tokens=kv,
        max_running_requests=running,
        max_context_length=context,
        mem_fraction_static=fraction,
    )
