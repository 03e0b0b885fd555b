"""The roofline timing model: published-figure sanity points and the KV pool it derives."""

from __future__ import annotations

import pytest

from homing.sim.config import SimConfig
from homing.sim.timing import (
    TimingModel,
    default_max_running_requests,
    model_spec,
    resolve_limits,
)

LLAMA_8B_H100 = TimingModel.from_names("llama-3.1-8b", "H100", 1)
LLAMA_70B_H100_TP8 = TimingModel.from_names("llama-3.1-70b", "H100", 8)


class TestSanityPoints:
    def test_70b_on_8_h100_prefills_8k_tokens_at_about_16k_tokens_per_second(self) -> None:
        """llama-3.1-70b TP8 prefill of 8,192 tokens runs at 14,000-20,000 tokens/s."""
        rate = 8192 / LLAMA_70B_H100_TP8.prefill_time_s(8192)
        assert 14_000 <= rate <= 20_000

    def test_8b_on_one_h100_decodes_batch_8_at_context_2000_in_6_to_14_ms(self) -> None:
        """A decode step of 8 sequences of 2,000 tokens takes 6-14 ms on one H100."""
        assert 6.0 <= LLAMA_8B_H100.decode_step_time_s(8, 2000) * 1e3 <= 14.0

    def test_cached_prefix_makes_prefill_cheaper_than_recomputing_it(self) -> None:
        """N new tokens after C cached cost more than N alone and less than C + N."""
        n, c = 2048, 6144
        with_cache = LLAMA_8B_H100.prefill_time_s(n, cached_tokens=c)
        assert LLAMA_8B_H100.prefill_time_s(n) < with_cache < LLAMA_8B_H100.prefill_time_s(n + c)

    def test_decode_grows_with_batch_and_context(self) -> None:
        """More sequences or longer contexts move more KV bytes, so the step is longer."""
        t = LLAMA_8B_H100
        assert t.decode_step_time_s(1, 1000) < t.decode_step_time_s(64, 1000)
        assert t.decode_step_time_s(64, 1000) < t.decode_step_time_s(64, 4000)

    def test_h200_decode_is_faster_by_about_the_bandwidth_ratio(self) -> None:
        """In the memory-bound regime an H200 step is ~4.8/3.35 times faster than an H100's."""
        h200 = TimingModel.from_names("llama-3.1-8b", "H200", 1)
        cost_h100 = LLAMA_8B_H100.step_cost(decode_batch=16, decode_context_tokens=16 * 2000)
        cost_h200 = h200.step_cost(decode_batch=16, decode_context_tokens=16 * 2000)
        assert cost_h100.memory_s / cost_h200.memory_s == pytest.approx(4.8 / 3.35)
        assert cost_h100.total_s > cost_h200.total_s

    def test_an_empty_step_costs_nothing(self) -> None:
        """No tokens, no time."""
        assert LLAMA_8B_H100.step_time_s() == 0.0


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
