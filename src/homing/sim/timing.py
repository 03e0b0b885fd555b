"""Roofline timing model of one SGLang worker (model x GPU x TP): how long a scheduler step takes.

Rule of this file: pure arithmetic over published hardware and model figures; every constant
names its source. No clock, no I/O, no randomness.

A scheduler step runs a batch that mixes prefill chunks (compute-bound) and decode tokens
(memory-bound). Its time is the roofline of the whole batch plus fixed costs:

    step_s    = max(compute_s, memory_s) + allreduce_s + step_overhead_s
    compute_s = FLOPs / (tp x peak_bf16_dense_flops x mfu)
    memory_s  = bytes / (tp x hbm_bandwidth x bandwidth_efficiency)

FLOPs (the usual dense-transformer count, e.g. Kaplan et al. 2020, "Scaling Laws", sec. 2.1;
Chowdhery et al. 2022, "PaLM", appendix B for the attention term):
    - 2 x params per token processed (prefill new tokens and decode tokens);
    - attention: 4 x layers x (heads x head_dim) per (query, key) pair; a prefill chunk of n
      new tokens after c cached ones has n x c + n (n + 1) / 2 pairs (causal), a decode token
      at context ctx has ctx pairs.

Bytes moved per step (decode is bandwidth-bound, e.g. Pope et al. 2022, "Efficiently Scaling
Transformer Inference", sec. 2): the weights once (2 bytes/param, bf16) plus the KV cache of
every sequence in the batch (context tokens x kv_bytes_per_token).

KV bytes per token = 2 (K and V) x layers x kv_heads x head_dim x 2 bytes (bf16).

Tensor parallelism splits FLOPs and bytes over `tp` GPUs and adds two all-reduces per layer
(after attention and after the MLP, Shoeybi et al. 2019, "Megatron-LM", sec. 3) of
tokens x hidden x 2 bytes each, costed with NCCL's bus-bandwidth convention
(time = size x 2 (tp - 1) / tp / busbw) plus a fixed latency per all-reduce.

KV pool capacity follows SGLang's memory split: GPU memory x tp x mem_fraction_static, minus
the weights, divided by KV bytes per token.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class TimingParams:
    """Efficiency constants of the roofline (dimensionless unless stated).

    prefill_mfu: achieved share of dense BF16 peak in GEMM-heavy steps. 0.40 is the usual
        figure for large-batch bf16 transformer forward passes on H100 (e.g. the Llama 3
        paper, Dubey et al. 2024, Table 4, reports 38-43% BF16 MFU in pre-training); it puts
        llama-3.1-70b on 8x H100 at ~16k prefill tokens/s at 8k tokens.
    bandwidth_efficiency: achieved share of HBM bandwidth in decode (GEMV + paged attention
        kernels reach 70-85% of peak on H100); 0.75 puts llama-3.1-8b at ~6.9 ms per token
        at batch 1, in line with published single-stream figures (~145 tokens/s).
    allreduce_latency_s: fixed cost of one small all-reduce over NVLink (s); SGLang's custom
        all-reduce takes ~10 us for decode-sized messages.
    step_overhead_s: scheduler + kernel-launch cost per step with CUDA graphs (s).
    """

    prefill_mfu: float = 0.40
    bandwidth_efficiency: float = 0.75
    allreduce_latency_s: float = 10e-6
    step_overhead_s: float = 0.5e-3


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
        contexts sum to `decode_context_tokens`. An empty step costs 0."""
        m, p = self.model, self.params
        new_tokens = sum(c.new_tokens for c in prefill)
        tokens = new_tokens + decode_batch
        if tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0)
        attn_pairs = decode_context_tokens + sum(
            c.new_tokens * c.cached_tokens + c.new_tokens * (c.new_tokens + 1) // 2 for c in prefill
        )
        flops = 2.0 * m.num_params * tokens + 4.0 * m.num_layers * m.attention_width * attn_pairs
        kv_read_tokens = decode_context_tokens + sum(
            c.cached_tokens + c.new_tokens for c in prefill
        )
        bytes_moved = m.weight_bytes + kv_read_tokens * m.kv_bytes_per_token
        compute_s = flops / (self.tp * self.gpu.peak_bf16_flops * p.prefill_mfu)
        memory_s = bytes_moved / (self.tp * self.gpu.hbm_bandwidth * p.bandwidth_efficiency)
        allreduce_s = 0.0
        if self.tp > 1:
            calls = 2 * m.num_layers
            size = tokens * m.hidden_size * 2
            ring = 2.0 * (self.tp - 1) / self.tp
            allreduce_s = calls * (p.allreduce_latency_s + size * ring / self.gpu.allreduce_busbw)
        return StepCost(compute_s, memory_s, allreduce_s, p.step_overhead_s)

    def step_time_s(
        self,
        prefill: Sequence[PrefillChunk] = (),
        decode_batch: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """Seconds for one step (see `step_cost`)."""
        return self.step_cost(prefill, decode_batch, decode_context_tokens).total_s

    def prefill_time_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill `new_tokens` after `cached_tokens` in one step (no decode)."""
        return self.step_time_s([PrefillChunk(new_tokens, cached_tokens)])

    def decode_step_time_s(self, batch: int, context_tokens: int) -> float:
        """Seconds for a decode-only step of `batch` sequences of `context_tokens` each."""
        return self.step_time_s(decode_batch=batch, decode_context_tokens=batch * context_tokens)


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
