"""GEMM 1's input on the folded path: step 1 of the contract (per-token-group FP8 requantized to
per-tensor FP8, the requant op's arithmetic) written as fp16, which holds every FP8 value exactly.
The folded GEMMs run an fp16 MMA whose activation operand must come straight from memory to stay
in flight across K groups (Triton 3.9's sm_90 build waits for an MMA at once when that operand is
converted in registers), so the FP8 values are widened once here instead of in every GEMM program.

Only tl APIs present in both Triton 3.6 and 3.9 are used."""

from __future__ import annotations

import triton
import triton.language as tl
from hal.backends.w4afp8.triton_kernels import _requant

# columns per program: eight scale groups of 128, one 16-byte vector per thread at 4 warps
BLOCK_H = 1024
NUM_WARPS = 4
# programs per expert along rows; each walks rows m, m + M_PROGRAMS, ... below masked_m
M_PROGRAMS = 32


@triton.jit
def requant_to_f16_kernel(x_ptr, x_scale_ptr, masked_m_ptr, in_scale_ptr, out_ptr, max_m, hidden,
                          scale_stride_e, scale_stride_m, scale_stride_g, fp8_max,
                          BLOCK_H: tl.constexpr, GROUP_K: tl.constexpr):
    """out[e, r, :] = fp16(fp8(clamp((x[e, r, :] * x_scale[e, r, group]) * (1 / in_scale)))) for
    r < masked_m[e] (clamped to max_m); other rows are neither read nor written.
    grid = (cdiv(hidden, BLOCK_H), m-programs, experts)."""
    expert = tl.program_id(2)
    rows = tl.minimum(tl.maximum(tl.load(masked_m_ptr + expert), 0), max_m)
    inv_in_scale = tl.math.div_rn(1.0, tl.load(in_scale_ptr).to(tl.float32))
    columns = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    live = columns < hidden
    for row in tl.range(tl.program_id(1), rows, tl.num_programs(1)):
        offsets = (expert.to(tl.int64) * max_m + row) * hidden + columns
        x = tl.load(x_ptr + offsets, mask=live, other=0.0)
        scale_row = expert.to(tl.int64) * scale_stride_e + tl.cast(row, tl.int64) * scale_stride_m
        scale = tl.load(x_scale_ptr + scale_row + (columns // GROUP_K) * scale_stride_g, mask=live,
                        other=0.0)
        xq = _requant(x.to(tl.float32) * scale, inv_in_scale, fp8_max, x_ptr.dtype.element_ty)
        tl.store(out_ptr + offsets, xq.to(tl.float16), mask=live)


def grid(experts: int, hidden: int, max_m: int) -> tuple:
    return (triton.cdiv(hidden, BLOCK_H), max(1, min(M_PROGRAMS, max_m)), experts)
