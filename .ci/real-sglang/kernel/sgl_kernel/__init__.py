"""Pure-PyTorch stand-in for the one sgl-kernel CPU function plain decoding calls on a CPU without AMX.

SGLang's CPU path imports `sgl_kernel.assign_req_to_token_pool_cpu` (sglang/srt/mem_cache/allocation.py) and calls
it on every KV allocation; the CPU build of sgl-kernel is not on PyPI and needs AVX-512/AMX. This package is placed
first on the server process's PYTHONPATH by ddsweep's real-engine environment (.ci/sglang-real.sh), never installed.
Any other attribute raises an AttributeError that names the missing function (the few names SGLang imports at module
load resolve to functions that raise NotImplementedError when called), so a code path that needs a real kernel fails
with a clear message instead of computing something wrong.
"""

from __future__ import annotations

import torch

__all__ = ["assign_req_to_token_pool_cpu"]

STAND_IN = True


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the request-to-token table, in place.

    Same semantics as the Triton kernel `assign_req_to_token_pool`: request i takes the next
    `end_offset[i] - start_offset[i]` entries of `out_cache_loc` (packed in batch order) and stores them at
    `req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]`.
    """
    if req_to_token.shape[1] != pool_len:
        raise ValueError(f"assign_req_to_token_pool_cpu: pool_len {pool_len} != req_to_token width "
                         f"{req_to_token.shape[1]}")
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    packed = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = end - start
        if length <= 0:
            continue
        req_to_token[row, start:end] = out_cache_loc[packed : packed + length].to(req_to_token.dtype)
        packed += length


def _not_implemented(name: str):
    """A function that raises when called: for names SGLang imports at module load but plain decoding never calls."""

    def missing(*args, **kwargs):
        raise NotImplementedError(_message(name))

    missing.__name__ = missing.__qualname__ = name
    return missing


def _message(name: str) -> str:
    return (f"sgl_kernel.{name} is not available: this is ddsweep's pure-PyTorch stand-in for the CPU build of "
            f"sgl-kernel (.ci/real-sglang/kernel), which implements only assign_req_to_token_pool_cpu; the code path "
            f"that needs {name} needs the real sgl-kernel (a GPU build, or the CPU build with AVX-512/AMX)")


# Imported at module load by SGLang 0.5.23's CPU path (a missing name would fail the import); none is called
# by plain decoding: the KV copy of speculative warm-up (kernels/ops/kvcache/cache_move.py) and the speculative
# tree, cache-location and accept kernels (kernels/ops/speculative/).
IMPORTED_ONLY = frozenset({
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
})


def __getattr__(name: str):
    if name in IMPORTED_ONLY:
        return _not_implemented(name)
    raise AttributeError(_message(name))
