"""Transposed GEMMs of the W4AFP8 masked MoE (17 rows per expert and more): the weight tile is the
MMA's M side and the expert's rows are its N side, so 16 rows fill an MMA and the weight stream is
what each program spends its time on at decode.

Per K group of 128 a [BLOCK_N, 128] weight tile is unpacked from int4 and multiplied with the
[128, BLOCK_M] activation tile converted from FP8. Two ways to apply the group's bf16 weight scale:

- per group (FOLD False): the unpacked q - 8 (exact in bf16 and FP8) times the activations, one MMA
  per group accumulating in fp32; the group's partial sum is then scaled by its weight scale and
  added to the fp32 accumulator, the rounding points of the FP8 GEMMs of triton_kernels.py. The
  scaling needs the MMA's result, so every group waits for its MMA.
- folded (FOLD True): the weight tile is (q - 8) * s * 2^c in fp16, which is exact: |q - 8| <= 8
  has at most 3 significant bits, s 8, so the product has at most 11, fp16's precision, as long as
  it is normal, which `layer.fold_shift` makes sure of with the power of two 2^c (chosen once per
  weight tensor, taken out again in the epilogue). e4m3 activations are exact in fp16 and each
  product exact in fp32, so the MMAs chain on one fp32 accumulator over all of K and stay in
  flight; the sums round at other points than per group (at every addition, never at a scale).

On NVIDIA the unpack is Marlin's: lop3 places nibbles into the mantissas of a 16-bit float pair,
bf16 128 + q or fp16 1024 + q, and one packed subtraction leaves q - 8 (folded: one packed multiply
by the scale pair follows), so eight weights cost eleven instructions (folded: fifteen). Elsewhere
(AMD, Triton's CPU interpreter) it shifts and masks; the interpreter's MMA runs in fp32 on the same
values.

The prepared weights are blocked by K group (int32 [E, K / 128, N, 16], triton_kernels.py), read
here as int16: int16 i of a column's group holds its k = 4 i .. 4 i + 3, lowest nibble first.

Only tl APIs present in both Triton 3.6 and 3.9 are used."""

from __future__ import annotations

import triton
import triton.language as tl
from hal.backends.w4afp8.triton_kernels import _activation, _requant
from hal.backends.w4afp8.triton_split_k import _arrive, _groups, _parts, _program, _tile

# One int16 pair in, four bf16 pairs out: pair j holds nibble j of each int16 as q - 8.
# lop3 immediate 0xEA is (a & b) | c; bf16x2 fma computes x * 1 + (-136) exactly.
_MAGIC_UNPACK_PTX = tl.constexpr("""
{
.reg .b32 t, one, bias;
mov.b32 one, 0x3F803F80;
mov.b32 bias, 0xC308C308;
lop3.b32 $0, $4, 0x000F000F, 0x43004300, 0xEA;
shr.u32 t, $4, 4;
lop3.b32 $1, t, 0x000F000F, 0x43004300, 0xEA;
shr.u32 t, $4, 8;
lop3.b32 $2, t, 0x000F000F, 0x43004300, 0xEA;
shr.u32 t, $4, 12;
lop3.b32 $3, t, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 $0, $0, one, bias;
fma.rn.bf16x2 $1, $1, one, bias;
fma.rn.bf16x2 $2, $2, one, bias;
fma.rn.bf16x2 $3, $3, one, bias;
}
""")


@triton.jit
def _unpack(packed, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """int16 [R, G / 4] -> [R, G] of q - 8 in DOT_DTYPE, k = 4 i + nibble."""
    if MAGIC:
        n0, n1, n2, n3 = tl.inline_asm_elementwise(
            _MAGIC_UNPACK_PTX, "=r,=r,=r,=r,r", [packed],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
        # (i, a, b) -> nibble 2 a + b of int16 i
        w = tl.join(tl.join(n0, n2), tl.join(n1, n3))
        w = tl.reshape(w, (packed.shape[0], packed.shape[1] * 4))
    else:
        shifts = tl.arange(0, 4) * 4
        nibbles = (packed.to(tl.int32)[:, :, None] >> shifts[None, None, :]) & 0xF
        w = tl.reshape(nibbles - 8, (packed.shape[0], packed.shape[1] * 4)).to(tl.float32)
    return w.to(DOT_DTYPE)


# One int16 pair and one fp16 scale pair in, four fp16 pairs out: pair j holds nibble j of each
# int16 as (q - 8) * scale. lop3 as above with fp16's 1024 (0x6400); 1024 + q - 1032 is exact, and
# so is the product with the scale (layer.fold_shift keeps it an 11-bit normal fp16).
_MAGIC_SCALED_UNPACK_PTX = tl.constexpr("""
{
.reg .b32 t, bias;
mov.b32 bias, 0x64086408;
lop3.b32 $0, $4, 0x000F000F, 0x64006400, 0xEA;
shr.u32 t, $4, 4;
lop3.b32 $1, t, 0x000F000F, 0x64006400, 0xEA;
shr.u32 t, $4, 8;
lop3.b32 $2, t, 0x000F000F, 0x64006400, 0xEA;
shr.u32 t, $4, 12;
lop3.b32 $3, t, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 $0, $0, bias;
sub.f16x2 $1, $1, bias;
sub.f16x2 $2, $2, bias;
sub.f16x2 $3, $3, bias;
mul.rn.f16x2 $0, $0, $5;
mul.rn.f16x2 $1, $1, $5;
mul.rn.f16x2 $2, $2, $5;
mul.rn.f16x2 $3, $3, $5;
}
""")


@triton.jit
def _unpack_scaled(packed, scale, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """int16 [R, G / 4] and fp32 [R] -> [R, G] of (q - 8) * scale in DOT_DTYPE, k = 4 i + nibble.
    MAGIC: DOT_DTYPE is fp16."""
    if MAGIC:
        scales = tl.broadcast_to(scale.to(tl.float16)[:, None], packed.shape)
        n0, n1, n2, n3 = tl.inline_asm_elementwise(
            _MAGIC_SCALED_UNPACK_PTX, "=r,=r,=r,=r,r,r", [packed, scales],
            dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=2)
        w = tl.join(tl.join(n0, n2), tl.join(n1, n3))
        return tl.reshape(w, (packed.shape[0], packed.shape[1] * 4))
    return (_unpack(packed, False, tl.float32) * scale[:, None]).to(DOT_DTYPE)


@triton.jit
def _group_step(acc, q_ptr, s_ptr, a_t, q_base, s_base, group, offs_n, live_n, N, scale_shift,
                GROUP_K: tl.constexpr, MAGIC: tl.constexpr, FOLD: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """acc + W[group, offs_n, :] @ a_t with the group's weight scales, [BLOCK_N, BLOCK_M] fp32:
    folded into the weights (times scale_shift) or applied to the group's fp32 partial (module
    docstring). q_ptr is int16, GROUP_K / 4 per column and group."""
    halves = tl.arange(0, GROUP_K // 4)
    column = (group * N + offs_n).to(tl.int64) * (GROUP_K // 4)
    packed = tl.load(q_ptr + q_base + column[:, None] + halves[None, :], mask=live_n[:, None], other=0)
    scale = tl.load(s_ptr + s_base + group * N + offs_n, mask=live_n, other=0.0).to(tl.float32)
    if FOLD:
        return tl.dot(_unpack_scaled(packed, scale * scale_shift, MAGIC, DOT_DTYPE), a_t, acc)
    return acc + tl.dot(_unpack(packed, MAGIC, DOT_DTYPE), a_t) * scale[:, None]


@triton.jit
def _activation_t(a_ptr, a_scale_ptr, expert, offs_m, live_m, k0, max_m, K, scale_stride_e,
                  scale_stride_m, scale_stride_g, inv_in_scale, fp8_max, GROUP_K: tl.constexpr,
                  GROUP_SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """[GROUP_K, BLOCK_M]: rows offs_m as per-tensor FP8 values, transposed, in DOT_DTYPE (exact).
    GROUP_SCALED: the rows are per-token-group FP8, requantized here as triton_kernels does."""
    offs_k = k0 + tl.arange(0, GROUP_K)
    rows = expert.to(tl.int64) * max_m + offs_m
    a = tl.load(a_ptr + rows[None, :] * K + offs_k[:, None], mask=live_m[None, :], other=0.0)
    if GROUP_SCALED:
        scale_row = expert.to(tl.int64) * scale_stride_e + offs_m.to(tl.int64) * scale_stride_m
        scale = tl.load(a_scale_ptr + scale_row + (k0 // GROUP_K) * scale_stride_g, mask=live_m,
                        other=0.0)
        a = _requant(a.to(tl.float32) * scale[None, :], inv_in_scale, fp8_max, a_ptr.dtype.element_ty)
    if a_ptr.dtype.element_ty != DOT_DTYPE:
        a = a.to(tl.float32).to(DOT_DTYPE)
    return a


@triton.jit
def _tile_offsets(slot, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """[BLOCK_N, BLOCK_M] offsets of workspace slot `slot` (one fp32 accumulator tile)."""
    local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    return slot.to(tl.int64) * (BLOCK_N * BLOCK_M) + local


@triton.jit
def _publish(ws_ptr, slot, acc, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Add this K split's fp32 partial sums into the tile's workspace slot."""
    tl.atomic_add(ws_ptr + _tile_offsets(slot, BLOCK_N, BLOCK_M), acc, sem="relaxed")


@triton.jit
def _collect(ws_ptr, slot, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """The summed tile, read from L2 where the atomics landed."""
    return tl.load(ws_ptr + _tile_offsets(slot, BLOCK_N, BLOCK_M), cache_modifier=".cg")


@triton.jit
def _store_h(h_ptr, gate, up, in_scale, inv_out_scale, fp8_max, swiglu_alpha, swiglu_limit, expert,
             offs_m, live_m, offs_n, live_n, max_m, inter, ACTIVATION: tl.constexpr, FP8: tl.constexpr):
    """GEMM 1's epilogue on a transposed [BLOCK_N, BLOCK_M] tile: the activation of the fp32 sums,
    requantized to GEMM 2's FP8 input, stored for the live rows and columns (FP8 values in a
    16-bit h where GEMM 2's MMA reads them so)."""
    act = _activation(gate * in_scale, up * in_scale, swiglu_alpha, swiglu_limit, ACTIVATION)
    h = _requant(act, inv_out_scale, fp8_max, FP8).to(h_ptr.dtype.element_ty)
    out_rows = expert.to(tl.int64) * max_m + offs_m
    tl.store(h_ptr + out_rows[None, :] * inter + offs_n[:, None], h, mask=live_m[None, :] & live_n[:, None])


@triton.jit
def _store_out(out_ptr, acc, in_scale, expert, offs_m, live_m, offs_n, live_n, max_m, hidden):
    """GEMM 2's epilogue on a transposed [BLOCK_N, BLOCK_M] tile: bf16 of the sums times the input
    scale, stored for the live rows and columns."""
    out_rows = expert.to(tl.int64) * max_m + offs_m
    tl.store(out_ptr + out_rows[None, :] * hidden + offs_n[:, None], (acc * in_scale).to(tl.bfloat16),
             mask=live_m[None, :] & live_n[:, None])


@triton.jit
def w4a8_decode_gemm1_kernel(x_ptr, x_scale_ptr, masked_m_ptr, q_ptr, s_ptr, in_scale_ptr,
                             out_scale_ptr, h_ptr, ws_ptr, counter_ptr, split_blocks, max_m, hidden,
                             inter, weight_rows, scale_stride_e, scale_stride_m, scale_stride_g,
                             fp8_max, swiglu_alpha, swiglu_limit, scale_shift,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_K: tl.constexpr,
                             SPLIT_K: tl.constexpr, ACTIVATION: tl.constexpr,
                             GROUP_SCALED: tl.constexpr, MAGIC: tl.constexpr, FOLD: tl.constexpr,
                             DOT_DTYPE: tl.constexpr, FP8: tl.constexpr):
    """h[e, r, n] = fp8(clamp(act(x[e, r] @ W13_e)[n] * (1 / s2))) for r < masked_m[e], n < inter.
    grid = (inter / BLOCK_N * SPLIT_K, m-programs, experts).

    SPLIT_K > 1 splits K over that many programs for the m-blocks below split_blocks (each
    m-program's first): each adds its fp32 partials into a zeroed workspace slot (2 per tile: gate,
    up) and counts itself in; the last to arrive applies the epilogue to the sums. Later m-blocks
    (a hot expert's) are walked by split 0 alone over all of K. FOLD: the weight scales are folded
    into the fp16 weight tile times scale_shift, which the epilogue divides out. x (without
    GROUP_SCALED) and h hold FP8 values (of dtype FP8), as FP8 or, for the fp16 MMA to read them
    straight from memory, as fp16."""
    n_block, split, n_blocks, m_program, expert = _program(SPLIT_K)
    groups = hidden // GROUP_K
    rows = tl.minimum(tl.load(masked_m_ptr + expert), max_m)
    in_scale = tl.load(in_scale_ptr).to(tl.float32)
    inv_in_scale = tl.math.div_rn(1.0, in_scale)
    sums_scale = in_scale * tl.math.div_rn(1.0, scale_shift)  # a power of two: exact
    inv_out_scale = tl.math.div_rn(1.0, tl.load(out_scale_ptr).to(tl.float32))
    q_base = expert.to(tl.int64) * weight_rows * (hidden // 4)
    s_base = expert.to(tl.int64) * (hidden // GROUP_K) * weight_rows
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    live_n = offs_n < inter
    for m_block in tl.range(m_program, (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(1)):
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        live_m = offs_m < rows
        parts = _parts(m_block, split_blocks, SPLIT_K)
        if split < parts:
            gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            first, end = _groups(split, parts, groups)
            for group in range(first, end):
                a_t = _activation_t(x_ptr, x_scale_ptr, expert, offs_m, live_m, group * GROUP_K,
                                    max_m, hidden, scale_stride_e, scale_stride_m, scale_stride_g,
                                    inv_in_scale, fp8_max, GROUP_K, GROUP_SCALED, DOT_DTYPE)
                gate = _group_step(gate, q_ptr, s_ptr, a_t, q_base, s_base, group, offs_n, live_n,
                                   weight_rows, scale_shift, GROUP_K, MAGIC, FOLD, DOT_DTYPE)
                if ACTIVATION != 2:  # gated: the up columns are [inter, 2 inter)
                    up = _group_step(up, q_ptr, s_ptr, a_t, q_base, s_base, group, offs_n + inter,
                                     live_n, weight_rows, scale_shift, GROUP_K, MAGIC, FOLD, DOT_DTYPE)
            last = parts == 1
            if SPLIT_K > 1:
                if parts > 1:
                    tile = _tile(expert, m_block, n_block, split_blocks, n_blocks)
                    _publish(ws_ptr, 2 * tile, gate, BLOCK_N, BLOCK_M)
                    _publish(ws_ptr, 2 * tile + 1, up, BLOCK_N, BLOCK_M)
                    last = _arrive(counter_ptr, tile, parts)
                    if last:
                        gate = _collect(ws_ptr, 2 * tile, BLOCK_N, BLOCK_M)
                        up = _collect(ws_ptr, 2 * tile + 1, BLOCK_N, BLOCK_M)
            if last:
                _store_h(h_ptr, gate, up, sums_scale, inv_out_scale, fp8_max, swiglu_alpha, swiglu_limit,
                         expert, offs_m, live_m, offs_n, live_n, max_m, inter, ACTIVATION, FP8)


@triton.jit
def w4a8_decode_gemm2_kernel(h_ptr, masked_m_ptr, q_ptr, s_ptr, in_scale_ptr, out_ptr, ws_ptr,
                             counter_ptr, split_blocks, max_m, inter, hidden, scale_shift,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_K: tl.constexpr,
                             SPLIT_K: tl.constexpr, MAGIC: tl.constexpr, FOLD: tl.constexpr,
                             DOT_DTYPE: tl.constexpr):
    """out[e, r, n] = bf16((h[e, r] @ W2_e)[n] * s2) for r < masked_m[e].
    grid = (hidden / BLOCK_N * SPLIT_K, m-programs, experts); SPLIT_K and FOLD as in GEMM 1, one
    workspace slot per tile."""
    n_block, split, n_blocks, m_program, expert = _program(SPLIT_K)
    groups = inter // GROUP_K
    rows = tl.minimum(tl.load(masked_m_ptr + expert), max_m)
    sums_scale = tl.load(in_scale_ptr).to(tl.float32) * tl.math.div_rn(1.0, scale_shift)
    q_base = expert.to(tl.int64) * hidden * (inter // 4)
    s_base = expert.to(tl.int64) * (inter // GROUP_K) * hidden
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    live_n = offs_n < hidden
    for m_block in tl.range(m_program, (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(1)):
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        live_m = offs_m < rows
        parts = _parts(m_block, split_blocks, SPLIT_K)
        if split < parts:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            first, end = _groups(split, parts, groups)
            for group in range(first, end):
                a_t = _activation_t(h_ptr, h_ptr, expert, offs_m, live_m, group * GROUP_K, max_m,
                                    inter, 0, 0, 0, 1.0, 0.0, GROUP_K, False, DOT_DTYPE)
                acc = _group_step(acc, q_ptr, s_ptr, a_t, q_base, s_base, group, offs_n, live_n,
                                  hidden, scale_shift, GROUP_K, MAGIC, FOLD, DOT_DTYPE)
            last = parts == 1
            if SPLIT_K > 1:
                if parts > 1:
                    tile = _tile(expert, m_block, n_block, split_blocks, n_blocks)
                    _publish(ws_ptr, tile, acc, BLOCK_N, BLOCK_M)
                    last = _arrive(counter_ptr, tile, parts)
                    if last:
                        acc = _collect(ws_ptr, tile, BLOCK_N, BLOCK_M)
            if last:
                _store_out(out_ptr, acc, sums_scale, expert, offs_m, live_m, offs_n, live_n, max_m, hidden)

