"""Dynamic e4m3 quantization of activations per row and per 128 columns (DeepSeek-V3's serving
numerics, vLLM 0.33.0's per_token_group_quant_fp8): q = clamp(v / s, +-448), s = max|v| / 448 over
each 1 x 128 slice, with fp32 scales [rows, ceil(cols / 128)]. The w8a8 GEMMs read q and s; GEMM
1's epilogue quantizes its own output this way (`quantize_rows` on a 128-wide tile), and the layer's
input is quantized once per call by `quantize_groups_kernel`. w8a8x2 adds a second e4m3 term per
value, what the first leaves in units of the same scale (`quantize_remainder`): a ~= (q + q_lo) * s,
so the two fp8 dots of a K step chain on one accumulator before the scales are applied."""

from __future__ import annotations

import triton
import triton.language as tl

FP8_GROUP = 128
FP8_E4M3_MAX = tl.constexpr(448.0)
# The smallest scale: an all-zero slice quantizes to zeros instead of dividing by zero.
MIN_AMAX = tl.constexpr(1e-12)
GROUPS_PER_PROGRAM = 8


@triton.jit
def quantize_rows(a, FP8_DTYPE: tl.constexpr):
    """[rows, 128] (or fewer columns, one group) -> (e4m3 q, fp32 scale [rows]) with a ~= q * scale."""
    amax = tl.max(tl.abs(a), axis=1)
    scale = tl.maximum(amax, MIN_AMAX) / FP8_E4M3_MAX
    q = tl.clamp(a / scale[:, None], -FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    return q, scale


@triton.jit
def quantize_remainder(a, q, scale, FP8_DTYPE: tl.constexpr):
    """The low term of w8a8x2: a / scale - q as e4m3, in units of the high term's scale. It is
    within one e4m3 step of q (at most 32, in range), so each value keeps 3 more mantissa bits
    (about bf16's 8); values below 2^-6 of the scale lose only what is under e4m3's subnormals,
    2^-10 of the scale. Taken from q as rounded, so a wrongly rounded high term is made up for."""
    return (a / scale[:, None] - q.to(tl.float32)).to(FP8_DTYPE)


@triton.jit
def quantize_groups_kernel(x_ptr, q_ptr, s_ptr, K, scale_cols, GROUPS: tl.constexpr, TERMS: tl.constexpr):
    """quantize_groups, a program per row and GROUPS slices."""
    quantize_groups(x_ptr, q_ptr, s_ptr, K, scale_cols, tl.program_id(0), tl.program_id(1), GROUPS, TERMS)


@triton.jit
def quantize_groups(x_ptr, q_ptr, s_ptr, K, scale_cols, row, part, GROUPS: tl.constexpr, TERMS: tl.constexpr):
    """Slices part * GROUPS .. + GROUPS - 1 (128 columns each) of one row: q [rows, K] e4m3,
    s [rows, scale_cols]. TERMS 2: each value also gets a low term, what the first leaves in units
    of the same scale (q [rows, 2, K]: a row's high terms, then its low terms; s as for one term)."""
    row = row.to(tl.int64)
    group = part * GROUPS + tl.arange(0, GROUPS)
    cols = group[:, None] * 128 + tl.arange(0, 128)[None, :]
    ok = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=ok, other=0.0).to(tl.float32)
    q, scale = quantize_rows(x, q_ptr.dtype.element_ty)
    tl.store(q_ptr + row * K * TERMS + cols, q, mask=ok)
    tl.store(s_ptr + row * scale_cols + group, scale, mask=group < scale_cols)
    if TERMS == 2:
        tl.store(q_ptr + row * K * 2 + K + cols, quantize_remainder(x, q, scale, q_ptr.dtype.element_ty),
                 mask=ok)
