"""The `sgl_kernel` ops SGLang 0.5.23 imports on CPU (`SGLANG_USE_CPU_ENGINE=1`), in PyTorch.

PyPI has only CUDA builds of sgl-kernel. On the plain (non-speculative) CPU path SGLang calls
two of these ops; the speculative-decoding ones only need to exist and raise if called.
`torch.ops.sgl_kernel` stays empty, so SGLang's AMX probe is False and the torch-native
attention backend runs every layer.
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+homing.cpu"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table.

    For request i (in order): `req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`
    takes the next `end_offset[i] - start_offset[i]` entries of `out_cache_loc`.
    Shapes: the first three and `end_offset` are 1-D of length batch; `req_to_token` is
    (pool rows, `pool_len`). Raises ValueError when `out_cache_loc` holds too few entries.
    """
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    needed = sum(e - s for s, e in zip(starts, ends, strict=True))
    if needed > out_cache_loc.numel():
        raise ValueError(f"out_cache_loc has {out_cache_loc.numel()} entries, {needed} needed")
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        if not 0 <= start <= end <= pool_len:
            raise ValueError(f"offsets {start}:{end} outside a row of {pool_len}")
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + count].to(req_to_token.dtype)
        taken += count


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """In every KV buffer b, copy row `src_loc[j]` to row `tgt_loc[j]` (all j, in order).

    `data_ptrs[b]`: the raw address of buffer b; `strides[b]`: its row size in bytes.
    `tgt_loc` and `src_loc` are 1-D of the same length. The buffers must be live tensors of
    the caller's (SGLang's KV pool); rows are copied with `memmove` (overlap-safe).
    """
    pointers = data_ptrs.tolist()
    row_bytes = strides.tolist()
    targets = tgt_loc.tolist()
    sources = src_loc.tolist()
    if len(targets) != len(sources):
        raise ValueError(f"{len(targets)} targets for {len(sources)} sources")
    for base, size in zip(pointers, row_bytes, strict=True):
        for target, source in zip(targets, sources, strict=True):
            ctypes.memmove(base + target * size, base + source * size, size)


def _speculative_only(name: str):  # type: ignore[no-untyped-def]
    def op(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name} is a speculative-decoding op, not provided on CPU by this package"
        )

    op.__name__ = name
    op.__doc__ = "Speculative decoding only: raises NotImplementedError."
    return op


rotate_input_ids_cpu = _speculative_only("rotate_input_ids_cpu")
assign_extend_cache_locs_cpu = _speculative_only("assign_extend_cache_locs_cpu")
assign_draft_cache_locs_contiguous_cpu = _speculative_only("assign_draft_cache_locs_contiguous_cpu")
fill_accept_out_cache_loc_cpu = _speculative_only("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _speculative_only("fill_bonus_tokens_cpu")
build_tree_kernel_efficient_cpu = _speculative_only("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _speculative_only("verify_tree_greedy_cpu")
build_draft_decode_metadata_cpu = _speculative_only("build_draft_decode_metadata_cpu")
