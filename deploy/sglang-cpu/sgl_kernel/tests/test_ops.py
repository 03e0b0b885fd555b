"""The two ops SGLang runs on CPU agree with a plain reference on random inputs, and the
speculative-only ops exist and refuse to run."""

from __future__ import annotations

import random

import pytest
import sgl_kernel
import torch


def _reference_assign(rows, table, starts, ends, locs):  # type: ignore[no-untyped-def]
    expected = table.clone()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        for col in range(start, end):
            expected[row, col] = locs[taken]
            taken += 1
    return expected


@pytest.mark.parametrize("seed", range(20))
def test_assign_req_to_token_pool_matches_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    pool_rows, pool_len = 8, 64
    batch = rng.randint(1, 6)
    rows = rng.sample(range(pool_rows), batch)
    starts = [rng.randint(0, pool_len) for _ in rows]
    ends = [rng.randint(s, pool_len) for s in starts]
    needed = sum(e - s for s, e in zip(starts, ends, strict=True))
    locs = torch.tensor([rng.randint(0, 10_000) for _ in range(needed + rng.randint(0, 3))])
    table = torch.full((pool_rows, pool_len), -1, dtype=torch.int32)
    expected = _reference_assign(rows, table, starts, ends, locs.tolist())
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor(rows), table, torch.tensor(starts), torch.tensor(ends), locs, pool_len
    )
    assert torch.equal(table, expected)


def test_assign_refuses_too_few_cache_locations() -> None:
    table = torch.zeros((2, 8), dtype=torch.int32)
    with pytest.raises(ValueError, match="2 entries, 3 needed"):
        sgl_kernel.assign_req_to_token_pool_cpu(
            torch.tensor([0]), table, torch.tensor([0]), torch.tensor([3]), torch.tensor([5, 6]), 8
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_copy_all_layer_kv_cache_matches_the_reference(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    buffers = [torch.randn(32, 4, 8, generator=generator).to(dtype) for _ in range(3)]
    buffers.append(torch.randn(32, 16, generator=generator).to(dtype))  # another row size
    sources = [3, 7, 7, 30, 0]
    targets = [10, 11, 12, 1, 31]
    expected = [b.clone() for b in buffers]
    for exp in expected:
        for tgt, src in zip(targets, sources, strict=True):
            exp[tgt] = exp[src].clone()
    pointers = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    sgl_kernel.copy_all_layer_kv_cache_cpu(
        pointers, strides, torch.tensor(targets), torch.tensor(sources)
    )
    for got, exp in zip(buffers, expected, strict=True):
        assert torch.equal(got, exp)


@pytest.mark.parametrize(
    "name",
    [
        "rotate_input_ids_cpu",
        "assign_extend_cache_locs_cpu",
        "assign_draft_cache_locs_contiguous_cpu",
        "fill_accept_out_cache_loc_cpu",
        "fill_bonus_tokens_cpu",
        "build_tree_kernel_efficient_cpu",
        "verify_tree_greedy_cpu",
        "build_draft_decode_metadata_cpu",
    ],
)
def test_speculative_ops_exist_and_refuse(name: str) -> None:
    with pytest.raises(NotImplementedError, match=name):
        getattr(sgl_kernel, name)()
