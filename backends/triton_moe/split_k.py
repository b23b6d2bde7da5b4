"""K split over programs for the expert GEMMs (gemm.py) where a layer's few blocks leave most SMs
idle (an EP rank at decode: deepseek-v3's 32 local experts see about one of 8 routes at 1 token, so
GEMM 1 has one block's 64 N tiles for 132 SMs). Split `split` of SPLIT_K walks its share of the K
steps, stores its fp32 partial in a slot of its own and counts itself in on the tile's counter; the
last to arrive sums the slots in split order, so the bytes out do not depend on which split came
last, and runs the epilogue. Only the counters start each call at zero (zeroed by the grouping
launch, or a memset); the workspace is written before it is read."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def scratch(blocks: int, block_m: int, *gemms, zeroed_by_grouping: bool, device) -> tuple:
    """(counters, [(fp32 partials, int32 counters) of each GEMM given as (N, GemmConfig, gate and
    up accumulators), or None where it does not split K]). The counters of all the GEMMs are one
    allocation, zeroed here (a memset) unless the grouping launch zeroes it; the last split of a
    tile sets its counter back to zero, so launches run again over the same scratch (a benchmark
    timing one stage) find them zeroed."""
    tiles = [blocks * triton.cdiv(n, gemm.block_n) if gemm.split_k > 1 else 0 for n, gemm, _ in gemms]
    if not any(tiles):
        return None, [None] * len(gemms)
    counters = (torch.empty if zeroed_by_grouping else torch.zeros)(sum(tiles), dtype=torch.int32,
                                                                     device=device)
    out, start = [], 0
    for (_, gemm, gated), count in zip(gemms, tiles, strict=True):
        if not count:
            out.append(None)
            continue
        elements = count * (2 if gated else 1) * gemm.split_k * block_m * gemm.block_n
        out.append((torch.empty(elements, dtype=torch.float32, device=device), counters[start:start + count]))
        start += count
    return counters, out


@triton.jit
def k_range(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[k_lo, k_hi) of this program's split (program_id(1)): whole K steps, split as evenly as
    they divide."""
    steps = tl.cdiv(K, BLOCK_K)
    split = tl.program_id(1)
    return (split * steps // SPLIT_K) * BLOCK_K, tl.minimum(((split + 1) * steps // SPLIT_K) * BLOCK_K, K)


@triton.jit
def _slot(ws_ptr, like, tile, part: tl.constexpr, split, PARTS: tl.constexpr, SPLIT_K: tl.constexpr):
    """Pointers of the [R, C] slot (R, C: `like`'s shape) of accumulator `part` of `tile` that
    split `split` writes."""
    R: tl.constexpr = like.shape[0]
    C: tl.constexpr = like.shape[1]
    local = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    slot = ((tile * PARTS + part) * SPLIT_K + split).to(tl.int64)
    return ws_ptr + slot * (R * C) + local


@triton.jit
def park(acc, ws_ptr, tile, part: tl.constexpr, PARTS: tl.constexpr, SPLIT_K: tl.constexpr):
    """Store this split's partial of accumulator `part` in its own slot."""
    tl.store(_slot(ws_ptr, acc, tile, part, tl.program_id(1), PARTS, SPLIT_K), acc)


@triton.jit
def arrive(counter_ptr, tile, SPLIT_K: tl.constexpr):
    """Count this split in; True for the last of the SPLIT_K to arrive, which then owns the sums."""
    tl.debug_barrier()  # every thread's partial is stored before the count is
    last = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1
    if last:
        tl.store(counter_ptr + tile, 0)  # every split has counted itself in: ready for the next call
    return last


@triton.jit
def ordered_sum(like, ws_ptr, tile, part: tl.constexpr, PARTS: tl.constexpr, SPLIT_K: tl.constexpr):
    """Accumulator `part` of `tile`: the SPLIT_K partials summed in split order, read from L2."""
    total = tl.load(_slot(ws_ptr, like, tile, part, 0, PARTS, SPLIT_K), cache_modifier=".cg")
    for split in tl.static_range(1, SPLIT_K):
        total += tl.load(_slot(ws_ptr, like, tile, part, split, PARTS, SPLIT_K), cache_modifier=".cg")
    return total
