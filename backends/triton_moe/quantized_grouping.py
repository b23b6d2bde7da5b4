"""w8a8's input quantization in the route grouping's first launch: the two read different inputs
and write different outputs, so one grid does both and a call has one dependent launch fewer. The
first programs group the routes (routing.align_routes, or routing.count_routes over several
programs), the rest quantize x (quant.quantize_groups, `parts` programs per row)."""

from __future__ import annotations

import triton
import triton.language as tl
from hal.backends.triton_moe.quant import quantize_groups
from hal.backends.triton_moe.routing import align_routes, count_routes


@triton.jit
def align_and_quantize_kernel(topk_ids_ptr, expert_map_ptr, sorted_routes_ptr, block_expert_ptr, cursor_ptr,
                              num_routes, num_experts, max_padded, max_blocks, x_ptr, q_ptr, s_ptr, K,
                              scale_cols, parts, LOCAL_EXPERTS: tl.constexpr, BINS: tl.constexpr,
                              BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, BLOCK_CHUNK: tl.constexpr,
                              HAS_MAP: tl.constexpr, GROUPS: tl.constexpr, TERMS: tl.constexpr):
    """Program 0 groups the routes; program 1 + i quantizes part i % parts of row i // parts."""
    pid = tl.program_id(0)
    if pid == 0:
        align_routes(topk_ids_ptr, expert_map_ptr, sorted_routes_ptr, block_expert_ptr, cursor_ptr,
                     num_routes, num_experts, max_padded, max_blocks, LOCAL_EXPERTS, BINS, BLOCK_M, CHUNK,
                     BLOCK_CHUNK, HAS_MAP)
    else:
        quantizer = pid - 1
        quantize_groups(x_ptr, q_ptr, s_ptr, K, scale_cols, quantizer // parts, quantizer % parts, GROUPS,
                        TERMS)


@triton.jit
def count_and_quantize_kernel(topk_ids_ptr, expert_map_ptr, counts_ptr, sorted_routes_ptr, num_routes,
                              num_experts, max_padded, programs, x_ptr, q_ptr, s_ptr, K, scale_cols, parts,
                              LOCAL_EXPERTS: tl.constexpr, BINS: tl.constexpr, CHUNK: tl.constexpr,
                              HAS_MAP: tl.constexpr, GROUPS: tl.constexpr, TERMS: tl.constexpr):
    """Programs below `programs` count routes; program programs + i quantizes as above."""
    pid = tl.program_id(0)
    if pid < programs:
        count_routes(pid, programs, topk_ids_ptr, expert_map_ptr, counts_ptr, sorted_routes_ptr, num_routes,
                     num_experts, max_padded, LOCAL_EXPERTS, BINS, CHUNK, HAS_MAP)
    else:
        quantizer = pid - programs
        quantize_groups(x_ptr, q_ptr, s_ptr, K, scale_cols, quantizer // parts, quantizer % parts, GROUPS,
                        TERMS)
