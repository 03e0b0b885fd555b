"""The timing model: issue 3's calibration points, presets, jitter, and the KV pool it derives."""

from __future__ import annotations

import random

import pytest

from homing.sim.config import SimConfig
from homing.sim.timing import (
    PRESETS,
    JitteredTimer,
    PrefillChunk,
    TimingModel,
    default_max_running_requests,
    model_spec,
    resolve_limits,
)

LLAMA_8B_H100 = TimingModel.from_names("llama-3.1-8b", "H100", 1)
LLAMA_8B_H200 = TimingModel.from_names("llama-3.1-8b", "H200", 1)
LLAMA_70B_H100_TP8 = TimingModel.from_names("llama-3.1-70b", "H100", 8)


class TestCalibrationTargets:
    def test_70b_on_8_h100_prefills_8k_tokens_at_14k_to_20k_tokens_per_second(self) -> None:
        """llama-3.1-70b TP8 prefill of 8,192 new tokens runs at 14,000-20,000 tokens/s."""
        rate = 8192 / LLAMA_70B_H100_TP8.prefill_time_s(8192)
        assert 14_000 <= rate <= 20_000

    def test_70b_on_8_h100_decodes_batch_80_at_context_1800_in_30_to_50_ms(self) -> None:
        """A decode-only step of 80 sequences of 1,800 tokens takes 30-50 ms on 8x H100."""
        assert 30.0 <= LLAMA_70B_H100_TP8.decode_step_time_s(80, 1800) * 1e3 <= 50.0

    def test_8b_on_one_h100_decodes_batch_8_at_context_2000_in_6_to_14_ms(self) -> None:
        """A decode step of 8 sequences of 2,000 tokens takes 6-14 ms on one H100."""
        assert 6.0 <= LLAMA_8B_H100.decode_step_time_s(8, 2000) * 1e3 <= 14.0

    @pytest.mark.parametrize(("batch", "context"), [(1, 2000), (8, 2000), (16, 4000)])
    def test_h200_decode_is_faster_by_the_bandwidth_ratio_within_10_percent(
        self, batch: int, context: int
    ) -> None:
        """In the memory-bound regime an H200 step is 4.8/3.35 times faster than an H100's,
        +-10%."""
        ratio = LLAMA_8B_H100.decode_step_time_s(batch, context) / LLAMA_8B_H200.decode_step_time_s(
            batch, context
        )
        assert ratio == pytest.approx(4.8 / 3.35, rel=0.10)

    @pytest.mark.parametrize("timing", [LLAMA_8B_H100, LLAMA_70B_H100_TP8])
    def test_cached_prefix_makes_prefill_cheaper_than_recomputing_it(
        self, timing: TimingModel
    ) -> None:
        """N new tokens after C cached cost more than N alone and less than C + N."""
        n, c = 2048, 6144
        with_cache = timing.prefill_time_s(n, cached_tokens=c)
        assert timing.prefill_time_s(n) < with_cache < timing.prefill_time_s(n + c)

    def test_published_h200_latency_points_are_within_20_percent(self) -> None:
        """vLLM's H200 latency benchmark (batch 8, 32 in / 128 out): 6.5 ms per step for
        8B TP1 and 16.2 ms for 70B TP4; the model lands within 20% of both."""
        llama_70b_h200_tp4 = TimingModel.from_names("llama-3.1-70b", "H200", 4)
        assert LLAMA_8B_H200.decode_step_time_s(8, 96) * 1e3 == pytest.approx(6.5, rel=0.20)
        assert llama_70b_h200_tp4.decode_step_time_s(8, 96) * 1e3 == pytest.approx(16.2, rel=0.20)


class TestStepModel:
    def test_decode_grows_with_batch_and_context(self) -> None:
        """More sequences or longer contexts move more KV bytes, so the step is longer."""
        t = LLAMA_8B_H100
        assert t.decode_step_time_s(1, 1000) < t.decode_step_time_s(64, 1000)
        assert t.decode_step_time_s(64, 1000) < t.decode_step_time_s(64, 4000)

    def test_tensor_parallel_steps_pay_two_all_reduces_per_layer(self) -> None:
        """At TP8 a step carries 2 x 80 all-reduces of at least 20 us; at TP1 none."""
        tp8 = LLAMA_70B_H100_TP8.step_cost(decode_batch=1, decode_context_tokens=100)
        tp1 = LLAMA_8B_H100.step_cost(decode_batch=1, decode_context_tokens=100)
        assert tp8.allreduce_s >= 160 * 20e-6
        assert tp1.allreduce_s == 0.0

    def test_a_mixed_step_costs_more_than_its_decode_alone(self) -> None:
        """Adding a prefill chunk to a decode batch lengthens the step."""
        t = LLAMA_70B_H100_TP8
        decode = t.step_time_s(decode_batch=64, decode_context_tokens=64 * 1500)
        mixed = t.step_time_s([PrefillChunk(512, 1000)], 64, 64 * 1500)
        assert mixed > decode

    def test_chunked_prefill_sums_its_chunks(self) -> None:
        """16k tokens in 8k chunks cost the two steps, the second after 8k cached tokens."""
        t = LLAMA_70B_H100_TP8
        expected = t.prefill_time_s(8192) + t.prefill_time_s(8192, cached_tokens=8192)
        assert t.prefill_time_s(16384, chunk_tokens=8192) == pytest.approx(expected)

    def test_an_empty_step_costs_nothing(self) -> None:
        """No tokens, no time."""
        assert LLAMA_8B_H100.step_time_s() == 0.0

    @pytest.mark.parametrize(("model", "gpu", "tp"), PRESETS)
    def test_every_preset_resolves_and_prefill_beats_decode_per_token(
        self, model: str, gpu: str, tp: int
    ) -> None:
        """Each of the six presets sizes a pool and prefills faster per token than it decodes
        one sequence."""
        t = TimingModel.from_names(model, gpu, tp)
        assert t.kv_capacity_tokens() > 100_000
        assert t.prefill_time_s(4096) / 4096 < t.decode_step_time_s(1, 4096)


class TestJitter:
    def test_jitter_stays_within_its_band_and_is_reproducible(self) -> None:
        """Jittered step times stay within +-jitter of the model and repeat with the seed."""
        base = LLAMA_8B_H100.decode_step_time_s(8, 2000)
        draws = []
        for _ in range(2):
            timer = JitteredTimer(LLAMA_8B_H100, 0.1, random.Random(7))
            draws.append([timer.step_time_s((), 8, 16_000) for _ in range(200)])
        assert draws[0] == draws[1]
        assert all(0.9 * base <= d <= 1.1 * base for d in draws[0])
        assert min(draws[0]) < base < max(draws[0])

    def test_jitter_outside_zero_to_one_is_refused(self) -> None:
        """A jitter of 1 or more (or negative) would allow non-positive step times."""
        with pytest.raises(ValueError):
            JitteredTimer(LLAMA_8B_H100, 1.0, random.Random(0))


class TestPoolSizing:
    def test_kv_bytes_per_token_follow_the_model_shape(self) -> None:
        """2 x layers x kv_heads x head_dim x 2 bytes: 128 KiB for 8B, 320 KiB for 70B."""
        assert model_spec("llama-3.1-8b").kv_bytes_per_token == 131_072
        assert model_spec("llama-3.1-70b").kv_bytes_per_token == 327_680

    def test_pool_is_memory_fraction_minus_weights(self) -> None:
        """8B on one H100 keeps ~450k tokens; 70B on 8 H100s ~1.26M."""
        assert 400_000 < LLAMA_8B_H100.kv_capacity_tokens() < 500_000
        assert 1_100_000 < LLAMA_70B_H100_TP8.kv_capacity_tokens() < 1_400_000
        expected = (81559 * 2**20 * 0.88 - 2 * 8_030_261_248) // 131_072
        assert LLAMA_8B_H100.kv_capacity_tokens() == expected

    def test_a_model_that_does_not_fit_is_refused(self) -> None:
        """70B weights (141 GB) do not fit on one H100."""
        with pytest.raises(ValueError, match="do not fit"):
            TimingModel.from_names("llama-3.1-70b", "H100", 1).kv_capacity_tokens()

    def test_limits_default_from_the_preset_and_honour_overrides(self) -> None:
        """Derived limits are page-aligned; explicit values win."""
        limits = resolve_limits(LLAMA_8B_H100, page_size=16)
        assert limits.kv_capacity_tokens % 16 == 0
        assert limits.max_context_length == 131_072
        assert limits.max_running_requests == default_max_running_requests(
            limits.kv_capacity_tokens, 131_072
        )
        small = resolve_limits(
            LLAMA_8B_H100, page_size=16, kv_capacity_tokens=1000, max_running_requests=3
        )
        assert (small.kv_capacity_tokens, small.max_running_requests) == (992, 3)

    def test_unknown_presets_are_refused_by_name(self) -> None:
        """An unknown model or GPU is a ValueError naming the known ones."""
        with pytest.raises(ValueError, match=r"llama-3\.1-8b"):
            model_spec("gpt-5")
        with pytest.raises(ValueError, match="H100"):
            TimingModel.from_names("llama-3.1-8b", "B200", 1)

    def test_sim_config_defaults_are_the_8b_h100_preset(self) -> None:
        """The default worker is llama-3.1-8b on one H100 with 16-token pages."""
        config = SimConfig()
        assert (config.model, config.gpu, config.tp, config.page_size) == (
            "llama-3.1-8b",
            "H100",
            1,
            16,
        )
        assert config.model_name == "llama-3.1-8b"
