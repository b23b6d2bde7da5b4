"""Decode GEMMs of the W4AFP8 masked MoE by nibble planes: the transposed GEMMs of triton_decode.py
(weights on the MMA's M side, the expert's rows on its N side) with the int4 unpack kept in the
MMA's register layout, so no weight tile passes through shared memory after its load.

A prepared int32 word holds eight weights of one column along K, k = 8 w + j for word w and nibble
j (GPTQ order, blocked by K group: triton_kernels.py). Nibble j of a group's 16 words is a
[BLOCK_N, 16] plane whose K index runs over the words: k = 8 w + j. Extracting a plane is
elementwise on the loaded words, so the compiler keeps the words in the layout the MMA reads and
unpacks them in registers. The activation is read the same way: one int64 word per row holds the
FP8 bytes k = 8 w .. 8 w + 7, and byte j of the [16, BLOCK_M] words is the plane's activation.
A group is eight K-16 MMAs (one per plane) into a zeroed fp32 partial; the partial is scaled by the
group's bf16 weight scale and added to the accumulator, the rounding points of the FP8 GEMMs.

The MMA is fp16: q - 8 and every e4m3 value are exact in fp16 and their products exact in fp32, so
it computes what an FP8 MMA would. With one or two warps per program Triton lowers the dot to
mma.sync (a warpgroup MMA needs four), whose result is in registers when its last MMA issues: no
wait between groups. On NVIDIA the unpacks are inline PTX (below); elsewhere (AMD, Triton's CPU
interpreter) shifts, masks and conversions.

Only tl APIs present in both Triton 3.6 and 3.9 are used."""

from __future__ import annotations

import triton
import triton.language as tl
from hal.backends.w4afp8.triton_decode import _store_h, _store_out
from hal.backends.w4afp8.triton_kernels import _requant
from hal.backends.w4afp8.triton_split_k import _arrive, _groups, _parts, _program, _tile

# Two int32 words in ($8, $9), eight fp16 pairs out: pair j holds nibble j of each word as q - 8.
# prmt gathers the low (high) halves of both words into one register; lop3 (immediate 0xEA:
# (a & b) | c) ORs a nibble of each half into the mantissa of fp16 1024: 1024 + q for a nibble at
# bits 0-3 (sub 1032 leaves q - 8), 1024 + 16 q for one at bits 4-7 (fma by 1 / 16, minus 72);
# every step is exact. Marlin's trick, on words whose halves are paired by prmt.
_WEIGHT_PLANES_PTX = tl.constexpr("""
{
.reg .b32 lo, hi, t, bias, sixteenth, bias16;
mov.b32 bias, 0x64086408;
mov.b32 sixteenth, 0x2C002C00;
mov.b32 bias16, 0xD480D480;
prmt.b32 lo, $8, $9, 0x5410;
prmt.b32 hi, $8, $9, 0x7632;
lop3.b32 $0, lo, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 $1, lo, 0x00F000F0, 0x64006400, 0xEA;
shr.u32 t, lo, 8;
lop3.b32 $2, t, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 $3, t, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 $4, hi, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 $5, hi, 0x00F000F0, 0x64006400, 0xEA;
shr.u32 t, hi, 8;
lop3.b32 $6, t, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 $7, t, 0x00F000F0, 0x64006400, 0xEA;
sub.f16x2 $0, $0, bias;
fma.rn.f16x2 $1, $1, sixteenth, bias16;
sub.f16x2 $2, $2, bias;
fma.rn.f16x2 $3, $3, sixteenth, bias16;
sub.f16x2 $4, $4, bias;
fma.rn.f16x2 $5, $5, sixteenth, bias16;
sub.f16x2 $6, $6, bias;
fma.rn.f16x2 $7, $7, sixteenth, bias16;
}
""")
# Two int64 activation words in ($8, $9), eight fp16 pairs out: pair j holds byte j of each word,
# an e4m3 value, converted exactly. prmt pairs byte j of both words, cvt converts the pair.
_ACT_PLANES_PTX = tl.constexpr("""
{
.reg .b32 alo, ahi, blo, bhi, t;
.reg .b16 p, u;
mov.b64 {alo, ahi}, $8;
mov.b64 {blo, bhi}, $9;
prmt.b32 t, alo, blo, 0x40;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $0, p;
prmt.b32 t, alo, blo, 0x51;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $1, p;
prmt.b32 t, alo, blo, 0x62;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $2, p;
prmt.b32 t, alo, blo, 0x73;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $3, p;
prmt.b32 t, ahi, bhi, 0x40;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $4, p;
prmt.b32 t, ahi, bhi, 0x51;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $5, p;
prmt.b32 t, ahi, bhi, 0x62;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $6, p;
prmt.b32 t, ahi, bhi, 0x73;
mov.b32 {p, u}, t;
cvt.rn.f16x2.e4m3x2 $7, p;
}
""")


@triton.jit
def _weight_words(q_ptr, q_base, group, offs_n, live_n, N, GROUP_K: tl.constexpr):
    """int32 [BLOCK_N, GROUP_K / 8]: the packed words of columns offs_n in K group `group`."""
    words = tl.arange(0, GROUP_K // 8)
    column = (group * N + offs_n).to(tl.int64) * (GROUP_K // 8)
    return tl.load(q_ptr + q_base + column[:, None] + words[None, :], mask=live_n[:, None], other=0)


@triton.jit
def _weight_planes(words, MAGIC: tl.constexpr):
    """The eight nibble planes of `words` (int32 [R, W]), for _weight_plane: with MAGIC unpacked
    here at once (fp16 [R, W] each, plane j holding q - 8 of nibble j), else the words."""
    if MAGIC:
        planes = tl.inline_asm_elementwise(
            _WEIGHT_PLANES_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [words], dtype=(tl.float16, ) * 8,
            is_pure=True, pack=2)
    else:
        planes = words
    return planes


@triton.jit
def _weight_plane(planes, j: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Plane j of _weight_planes' result as q - 8 in DOT_DTYPE."""
    if MAGIC:
        plane = planes[j]
    else:
        plane = (((planes >> (4 * j)) & 0xF) - 8).to(tl.float32).to(DOT_DTYPE)
    return plane


@triton.jit
def _act_words(a_ptr, expert, offs_m, live_m, k0, max_m, K, GROUP_K: tl.constexpr):
    """int64 [GROUP_K / 8, BLOCK_M]: word w of row m holds the FP8 bytes k0 + 8 w .. k0 + 8 w + 7
    of that row (lowest first). Dead rows load as 0 and are never stored."""
    words = tl.arange(0, GROUP_K // 8)
    rows = expert.to(tl.int64) * max_m + offs_m
    word_ptr = a_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    return tl.load(word_ptr + (rows[None, :] * K + k0) // 8 + words[:, None], mask=live_m[None, :],
                   other=0)


@triton.jit
def _act_planes(words, MAGIC: tl.constexpr):
    """The eight byte planes of `words` (int64 [W, BLOCK_M]), for _act_plane: with MAGIC converted
    here at once (fp16 [W, BLOCK_M] each, plane j holding byte j's e4m3 value), else the words."""
    if MAGIC:
        planes = tl.inline_asm_elementwise(
            _ACT_PLANES_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,l,l", [words], dtype=(tl.float16, ) * 8,
            is_pure=True, pack=2)
    else:
        planes = words
    return planes


@triton.jit
def _act_plane(planes, j: tl.constexpr, row_scale, inv_in_scale, fp8_max, fp8_dtype: tl.constexpr,
               GROUP_SCALED: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Plane j of _act_planes' result as per-tensor FP8 values in DOT_DTYPE (exact). GROUP_SCALED:
    the bytes are per-token-group FP8 with scales row_scale [BLOCK_M], requantized here with the
    contract's arithmetic."""
    if MAGIC:
        a = planes[j]
    else:
        a = ((planes >> (8 * j)) & 0xFF).to(tl.uint8).to(fp8_dtype, bitcast=True)
    if GROUP_SCALED:
        a = _requant(a.to(tl.float32) * row_scale[None, :], inv_in_scale, fp8_max, fp8_dtype)
    return a.to(tl.float32).to(DOT_DTYPE)


@triton.jit
def _group_scale(s_ptr, s_base, group, offs_n, live, N):
    """fp32 [BLOCK_N]: the bf16 weight scales of columns offs_n in K group `group`."""
    return tl.load(s_ptr + s_base + group * N + offs_n, mask=live, other=0.0).to(tl.float32)


@triton.jit
def _row_scale(a_scale_ptr, expert, offs_m, live_m, group, scale_stride_e, scale_stride_m,
               scale_stride_g, GROUP_SCALED: tl.constexpr):
    """fp32 [BLOCK_M]: DeepEP's per-token-group scales of rows offs_m in K group `group`, or 1."""
    if GROUP_SCALED:
        row = expert.to(tl.int64) * scale_stride_e + offs_m.to(tl.int64) * scale_stride_m
        scale = tl.load(a_scale_ptr + row + group * scale_stride_g, mask=live_m, other=0.0)
    else:
        scale = tl.full(offs_m.shape, 1.0, tl.float32)
    return scale


@triton.jit
def _slot(ws_ptr, tile, accumulator, split, ACCUMULATORS: tl.constexpr, SPLIT_K: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Pointers of the workspace tile that K split `split` of `tile` writes its fp32 partial
    sums of `accumulator` (0: gate or the only one, 1: up) to."""
    local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    slot = (tile * ACCUMULATORS + accumulator) * SPLIT_K + split
    return ws_ptr + slot.to(tl.int64) * (BLOCK_N * BLOCK_M) + local


@triton.jit
def _ordered_sum(ws_ptr, tile, accumulator, ACCUMULATORS: tl.constexpr, SPLIT_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """The SPLIT_K partials of `tile` summed in split order, read from L2 where they were stored:
    the same fp32 bytes whichever split arrived last."""
    total = tl.load(_slot(ws_ptr, tile, accumulator, 0, ACCUMULATORS, SPLIT_K, BLOCK_N, BLOCK_M),
                    cache_modifier=".cg")
    for split in tl.static_range(1, SPLIT_K):
        total += tl.load(_slot(ws_ptr, tile, accumulator, split, ACCUMULATORS, SPLIT_K, BLOCK_N,
                               BLOCK_M), cache_modifier=".cg")
    return total


@triton.jit
def w4a8_planes_gemm1_kernel(x_ptr, x_scale_ptr, masked_m_ptr, q_ptr, s_ptr, in_scale_ptr,
                             out_scale_ptr, h_ptr, ws_ptr, counter_ptr, split_blocks, max_m, hidden,
                             inter, weight_rows, scale_stride_e, scale_stride_m, scale_stride_g,
                             fp8_max, swiglu_alpha, swiglu_limit,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_K: tl.constexpr,
                             SPLIT_K: tl.constexpr, ACTIVATION: tl.constexpr,
                             GROUP_SCALED: tl.constexpr, MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """h[e, r, n] = fp8(clamp(act(x[e, r] @ W13_e)[n] * (1 / s2))) for r < masked_m[e], n < inter.
    grid = (inter / BLOCK_N * SPLIT_K, m-programs, experts); q_ptr is the prepared int32 weight.
    The K split, its workspace and the hot expert's later m-blocks as in triton_decode. Each
    group's weight scales are loaded one group ahead, so their latency hides behind a group."""
    n_block, split, n_blocks, m_program, expert = _program(SPLIT_K)
    groups = hidden // GROUP_K
    rows = tl.minimum(tl.load(masked_m_ptr + expert), max_m)
    in_scale = tl.load(in_scale_ptr).to(tl.float32)
    inv_in_scale = tl.math.div_rn(1.0, in_scale)
    inv_out_scale = tl.math.div_rn(1.0, tl.load(out_scale_ptr).to(tl.float32))
    fp8: tl.constexpr = x_ptr.dtype.element_ty
    q_base = expert.to(tl.int64) * weight_rows * (hidden // 8)
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
            g_scale = _group_scale(s_ptr, s_base, first, offs_n, live_n, weight_rows)
            u_scale = _group_scale(s_ptr, s_base, first, offs_n + inter, live_n, weight_rows)
            for group in range(first, end):
                a_planes = _act_planes(_act_words(x_ptr, expert, offs_m, live_m, group * GROUP_K,
                                                  max_m, hidden, GROUP_K), MAGIC)
                row_scale = _row_scale(x_scale_ptr, expert, offs_m, live_m, group, scale_stride_e,
                                       scale_stride_m, scale_stride_g, GROUP_SCALED)
                g_planes = _weight_planes(_weight_words(q_ptr, q_base, group, offs_n, live_n,
                                                        weight_rows, GROUP_K), MAGIC)
                g_part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                if ACTIVATION != 2:  # gated: the up columns are [inter, 2 inter)
                    u_planes = _weight_planes(_weight_words(q_ptr, q_base, group, offs_n + inter,
                                                            live_n, weight_rows, GROUP_K), MAGIC)
                    u_part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                ahead = tl.minimum(group + 1, end - 1)  # the last group reloads its own
                g_next = _group_scale(s_ptr, s_base, ahead, offs_n, live_n, weight_rows)
                if ACTIVATION != 2:
                    u_next = _group_scale(s_ptr, s_base, ahead, offs_n + inter, live_n, weight_rows)
                for j in tl.static_range(8):
                    a_j = _act_plane(a_planes, j, row_scale, inv_in_scale, fp8_max, fp8, GROUP_SCALED,
                                     MAGIC, DOT_DTYPE)
                    g_part = tl.dot(_weight_plane(g_planes, j, MAGIC, DOT_DTYPE), a_j, g_part)
                    if ACTIVATION != 2:
                        u_part = tl.dot(_weight_plane(u_planes, j, MAGIC, DOT_DTYPE), a_j, u_part)
                gate += g_part * g_scale[:, None]
                g_scale = g_next
                if ACTIVATION != 2:
                    up += u_part * u_scale[:, None]
                    u_scale = u_next
            last = parts == 1
            if SPLIT_K > 1:
                if parts > 1:
                    tile = _tile(expert, m_block, n_block, split_blocks, n_blocks)
                    tl.store(_slot(ws_ptr, tile, 0, split, 2, SPLIT_K, BLOCK_N, BLOCK_M), gate)
                    tl.store(_slot(ws_ptr, tile, 1, split, 2, SPLIT_K, BLOCK_N, BLOCK_M), up)
                    last = _arrive(counter_ptr, tile, parts)
                    if last:
                        gate = _ordered_sum(ws_ptr, tile, 0, 2, SPLIT_K, BLOCK_N, BLOCK_M)
                        up = _ordered_sum(ws_ptr, tile, 1, 2, SPLIT_K, BLOCK_N, BLOCK_M)
            if last:
                _store_h(h_ptr, gate, up, in_scale, inv_out_scale, fp8_max, swiglu_alpha, swiglu_limit,
                         expert, offs_m, live_m, offs_n, live_n, max_m, inter, ACTIVATION,
                         h_ptr.dtype.element_ty)


@triton.jit
def w4a8_planes_gemm2_kernel(h_ptr, masked_m_ptr, q_ptr, s_ptr, in_scale_ptr, out_ptr, ws_ptr,
                             counter_ptr, split_blocks, max_m, inter, hidden, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, GROUP_K: tl.constexpr, SPLIT_K: tl.constexpr,
                             MAGIC: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """out[e, r, n] = bf16((h[e, r] @ W2_e)[n] * s2) for r < masked_m[e]; grid, K split and scale
    prefetch as in GEMM 1, one workspace slot per tile."""
    n_block, split, n_blocks, m_program, expert = _program(SPLIT_K)
    groups = inter // GROUP_K
    rows = tl.minimum(tl.load(masked_m_ptr + expert), max_m)
    in_scale = tl.load(in_scale_ptr).to(tl.float32)
    fp8: tl.constexpr = h_ptr.dtype.element_ty
    q_base = expert.to(tl.int64) * hidden * (inter // 8)
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
            scale = _group_scale(s_ptr, s_base, first, offs_n, live_n, hidden)
            for group in range(first, end):
                a_planes = _act_planes(_act_words(h_ptr, expert, offs_m, live_m, group * GROUP_K,
                                                  max_m, inter, GROUP_K), MAGIC)
                planes = _weight_planes(_weight_words(q_ptr, q_base, group, offs_n, live_n, hidden,
                                                      GROUP_K), MAGIC)
                scale_next = _group_scale(s_ptr, s_base, tl.minimum(group + 1, end - 1), offs_n,
                                          live_n, hidden)
                part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for j in tl.static_range(8):
                    a_j = _act_plane(a_planes, j, 1.0, 1.0, 0.0, fp8, False, MAGIC, DOT_DTYPE)
                    part = tl.dot(_weight_plane(planes, j, MAGIC, DOT_DTYPE), a_j, part)
                acc += part * scale[:, None]
                scale = scale_next
            last = parts == 1
            if SPLIT_K > 1:
                if parts > 1:
                    tile = _tile(expert, m_block, n_block, split_blocks, n_blocks)
                    tl.store(_slot(ws_ptr, tile, 0, split, 1, SPLIT_K, BLOCK_N, BLOCK_M), acc)
                    last = _arrive(counter_ptr, tile, parts)
                    if last:
                        acc = _ordered_sum(ws_ptr, tile, 0, 1, SPLIT_K, BLOCK_N, BLOCK_M)
            if last:
                _store_out(out_ptr, acc, in_scale, expert, offs_m, live_m, offs_n, live_n, max_m, hidden)
