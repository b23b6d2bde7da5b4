"""mxfp4 weights repacked once for the tensor cores, and their exact decode in registers.

The checkpoint stores e2m1 nibbles two per byte along K (even k low) with one e8m0 exponent per 32
values of K. `repack` (in prepare_weights) rewrites each 128-wide K step of a weight row as 16 int32
words and one int32 of scales, both stored step-major ([steps, N, 16] and [steps, N]): the rows of a
tile's step are one contiguous run (64 bytes each), not 64 bytes at a stride of the row's length.
Word r holds the values k = 32 j + 2 r and k + 1 of the four scale groups j, so the 16 words give
group j (its 32 values) as 16 pairs of adjacent k, the way a tensor core takes two 16-bit values
from one 32-bit register. Byte j of the scales int32 is group j's e8m0. K is padded to whole steps
with zero nibbles.

The decode is exact and branch-free. An e2m1 nibble s|e1 e0|m moved to bf16's sign bit and to bits
6..8 (the low two exponent bits and the top mantissa bit) is the bf16 of its value times 2^-126,
the normal values (e > 0) and the subnormal 0.5 (e = 0, m = 1: bf16's subnormal 2^-127) alike.
The word's bits are placed (PAIR_PARTS) so that one rotation and one mask build both bf16 patterns
of a pair for three groups (one of them unrotated), and two of each for the fourth: nine integer
operations per word, where nibbles kept whole need sixteen (each pair's sign and magnitude shifted
apart, then masked and merged). On NVIDIA (PAIR_FMA) one bf16x2 FMA by 2^(e8m0 - 1) and -0 scales
both halves at once (inline PTX: Triton has no bf16x2 view of an int32), restoring the 2^126 and
applying the scale: exact, the product has two significant bits, and adding -0 changes no product
(not even a zero's sign). Elsewhere a shift or a mask makes each half the fp32 of the same value,
one fp32 multiply applies the same scale and one conversion packs the pair to bf16. Exponents above
128 (2^(e - 1) past the 8-bit exponent's range) take a second multiply, compiled in only for
weights that hold one (SCALE_HIGH). The four groups of a step are joined along K into one
[rows, 128] tile: one dot per K step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

STEP_K = 128  # K values per step: 16 words of a row
WORDS_PER_STEP = 16
GROUP = 32  # K values per e8m0 scale
GROUPS_PER_STEP = STEP_K // GROUP
# Above this e8m0, 2^(e8m0 - 1) overflows fp32: a weight holding one is scaled in two multiplies.
ONE_MULTIPLY_MAX_E8M0 = tl.constexpr(128)
REPACK_EXPERTS = 8  # experts repacked at a time: bounds the int64 temporaries

# A decoded pair: bf16 bits 6, 7, 8 and 15 of each half (the even k low, the odd k high) take the
# nibble's m, e0, e1 and s.
NIBBLE_BIT = {6: 0, 7: 1, 8: 2, 15: 3}  # bf16 bit within a half -> e2m1 nibble bit
PATTERN = 0x81C081C0
# Group j's pair is the OR over its parts of (word rotated left by `rotation`) & `mask`. Each group
# owns the 8 word bits its parts rotate onto the pattern. Four rotated copies of one half's pattern
# (bits 6, 7, 8 and 15) cannot tile 16 bits, so only three groups take it whole and group 3 takes
# m from one rotation and e0, e1, s from another.
ROTATIONS = (0, 4, 10)  # groups 0, 1, 2: the whole pattern
SPLIT_PARTS = ((6, 0x00400040), (14, 0x81808180))  # group 3: m, then e0 e1 s
PAIR_PARTS = tuple(((r, PATTERN),) for r in ROTATIONS) + (SPLIT_PARTS,)


def _int32(bits: int) -> int:
    return bits - (1 << 32) if bits >= 1 << 31 else bits


_PATTERN = tl.constexpr(_int32(PATTERN))
_ROTATION_1 = tl.constexpr(ROTATIONS[1])
_ROTATION_2 = tl.constexpr(ROTATIONS[2])
_SPLIT_ROTATION_A = tl.constexpr(SPLIT_PARTS[0][0])
_SPLIT_MASK_A = tl.constexpr(_int32(SPLIT_PARTS[0][1]))
_SPLIT_ROTATION_B = tl.constexpr(SPLIT_PARTS[1][0])
_SPLIT_MASK_B = tl.constexpr(_int32(SPLIT_PARTS[1][1]))
# $0 = $1 * $2 + (-0, -0) on a pair of bf16 (sm_80+): both halves of a decoded word scaled at once.
_PAIR_FMA_PTX = tl.constexpr("""
{
.reg .b32 negzero;
mov.b32 negzero, 0x80008000;
fma.rn.bf16x2 $0, $1, $2, negzero;
}
""")


def steps(k: int) -> int:
    return triton.cdiv(k, STEP_K)


def repack(packed: torch.Tensor, e8m0: torch.Tensor) -> tuple:
    """Checkpoint mxfp4 ([E, N, K/2] uint8, even k in the low nibble; e8m0 [E, N, K/32]) to
    (words [E, steps, N, 16] int32, scales [E, steps, N] int32, scale_high: some e8m0 above
    ONE_MULTIPLY_MAX_E8M0). Past K: zero nibbles, zero scales."""
    E, N, half = packed.shape
    K = 2 * half
    S = steps(K)
    words = torch.empty(E, S, N, WORDS_PER_STEP, dtype=torch.int32, device=packed.device)
    for e0 in range(0, E, REPACK_EXPERTS):
        p = packed[e0:e0 + REPACK_EXPERTS].to(torch.int64)
        e = p.shape[0]
        nibbles = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(e, N, K)
        nibbles = torch.nn.functional.pad(nibbles, (0, S * STEP_K - K))
        # k = 32 j + 2 r + b within a step -> group j, word r, half b
        nibbles = nibbles.view(e, N, S, GROUPS_PER_STEP, WORDS_PER_STEP, 2)
        word = torch.zeros(e, N, S, WORDS_PER_STEP, dtype=torch.int64, device=packed.device)
        for j, parts in enumerate(PAIR_PARTS):
            for rotation, mask in parts:
                for bit in (b for b in range(32) if mask >> b & 1):
                    value = nibbles[:, :, :, j, :, bit // 16]
                    word |= ((value >> NIBBLE_BIT[bit % 16]) & 1) << ((bit - rotation) % 32)
        word = torch.where(word >= 2**31, word - 2**32, word)
        words[e0:e0 + REPACK_EXPERTS] = word.transpose(1, 2).to(torch.int32)
    scales = torch.nn.functional.pad(e8m0, (0, S * GROUPS_PER_STEP - e8m0.shape[2])).to(torch.int64)
    scales = scales.view(E, N, S, GROUPS_PER_STEP) << (8 * torch.arange(GROUPS_PER_STEP, device=e8m0.device))
    scales = scales.sum(dim=-1)
    scales = torch.where(scales >= 2**31, scales - 2**32, scales).to(torch.int32)
    return words, scales.transpose(1, 2).contiguous(), bool((e8m0 > ONE_MULTIPLY_MAX_E8M0.value).any())


@triton.jit
def _bf16x2_power_of_two(exponent):
    """The int32 holding 2^exponent as bf16 in both halves (exponent within bf16's normal range):
    one multiply puts the biased exponent at bits 7 and 23."""
    return (exponent + 127) * 0x00800080


@triton.jit
def _pair_fma(pair, scale):
    return tl.inline_asm_elementwise(_PAIR_FMA_PTX, "=r,r,r", [pair, scale], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def _rotate_left(words, rotation: tl.constexpr):
    bits = words.to(tl.uint32, bitcast=True)
    return ((bits << rotation) | (bits >> (32 - rotation))).to(tl.int32, bitcast=True)


@triton.jit
def _pair_pattern(words, j: tl.constexpr):
    """Both bf16 patterns (value times 2^-126) of group j's pair in each word (PAIR_PARTS)."""
    if j == 0:
        pair = words & _PATTERN
    elif j == 1:
        pair = _rotate_left(words, _ROTATION_1) & _PATTERN
    elif j == 2:
        pair = _rotate_left(words, _ROTATION_2) & _PATTERN
    else:
        pair = ((_rotate_left(words, _SPLIT_ROTATION_A) & _SPLIT_MASK_A)
                | (_rotate_left(words, _SPLIT_ROTATION_B) & _SPLIT_MASK_B))
    return pair


@triton.jit
def group_tile(words, j: tl.constexpr, scales, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr,
               SWAP_AB: tl.constexpr, PAIR_FMA: tl.constexpr):
    """Scale group j of a step from its 16 words ([rows, 16] with SWAP_AB, else [16, rows]) and the
    rows' scales int32 (byte j: the group's e8m0): [rows, 32] with SWAP_AB, else [32, rows], in
    bf16 (fp32 with DOT_F32). PAIR_FMA: scaled by bf16x2 FMAs (NVIDIA's inline PTX; not with
    DOT_F32)."""
    pair = _pair_pattern(words, j)
    e8m0 = (scales >> (8 * j)) & 0xFF
    if SWAP_AB:
        e8m0 = e8m0[:, None]
    else:
        e8m0 = e8m0[None, :]
    if SCALE_HIGH:
        e8m0_low = tl.minimum(e8m0, ONE_MULTIPLY_MAX_E8M0)
    else:
        e8m0_low = e8m0
    if PAIR_FMA:
        tl.static_assert(not DOT_F32, "the bf16x2 FMA writes bf16 pairs")
        pair = _pair_fma(pair, _bf16x2_power_of_two(e8m0_low - 1))
        if SCALE_HIGH:
            pair = _pair_fma(pair, _bf16x2_power_of_two(tl.maximum(e8m0 - ONE_MULTIPLY_MAX_E8M0, 0)))
        even = pair.to(tl.int16).to(tl.bfloat16, bitcast=True)
        odd = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        low = ((e8m0_low + 126) << 23).to(tl.float32, bitcast=True)
        even = (pair << 16).to(tl.float32, bitcast=True) * low
        odd = (pair & -65536).to(tl.float32, bitcast=True) * low
        if SCALE_HIGH:
            high = ((tl.maximum(e8m0 - ONE_MULTIPLY_MAX_E8M0, 0) + 127) << 23).to(tl.float32, bitcast=True)
            even = even * high
            odd = odd * high
        if not DOT_F32:
            even = even.to(tl.bfloat16)
            odd = odd.to(tl.bfloat16)
    both = tl.join(even, odd)
    if SWAP_AB:
        tile = tl.reshape(both, (both.shape[0], 2 * both.shape[1]))
    else:
        tile = tl.reshape(tl.permute(both, (0, 2, 1)), (2 * both.shape[0], both.shape[1]))
    return tile


@triton.jit
def _cat_k(a, b, SWAP_AB: tl.constexpr):
    """a then b along K (the last axis with SWAP_AB, else the first)."""
    both = tl.join(a, b)
    if SWAP_AB:
        cat = tl.reshape(tl.permute(both, (0, 2, 1)), (a.shape[0], 2 * a.shape[1]))
    else:
        cat = tl.reshape(tl.permute(both, (2, 0, 1)), (2 * a.shape[0], a.shape[1]))
    return cat


@triton.jit
def step_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we, stride_se,
              SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr,
              PAIR_FMA: tl.constexpr):
    """The weight rows' 128-wide K step at k0, decoded and scaled: [rows, 128] with SWAP_AB (the
    dot's first operand), else [128, rows]."""
    step = k0 // 128
    r = tl.arange(0, 16)
    row_words = expert * stride_we + step * (N_TOTAL * 16) + rows.to(tl.int64) * 16
    if SWAP_AB:
        words = tl.load(w_ptr + row_words[:, None] + r[None, :], mask=row_ok[:, None], other=0)
    else:
        words = tl.load(w_ptr + row_words[None, :] + r[:, None], mask=row_ok[None, :], other=0)
    scales = tl.load(s_ptr + expert * stride_se + step * N_TOTAL + rows, mask=row_ok, other=0)
    t0 = group_tile(words, 0, scales, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    t1 = group_tile(words, 1, scales, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    t2 = group_tile(words, 2, scales, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    t3 = group_tile(words, 3, scales, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    return _cat_k(_cat_k(t0, t1, SWAP_AB), _cat_k(t2, t3, SWAP_AB), SWAP_AB)


@triton.jit
def dot_step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we,
             stride_se, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr,
             PAIR_FMA: tl.constexpr):
    """acc += x[a_rows, k0:k0+128] @ W[rows, k0:k0+128].T (acc [BM, rows]), or W @ x.T into
    acc [rows, BM] with SWAP_AB, the decoded weights as the dot's register operand."""
    w = step_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we, stride_se, SCALE_HIGH,
                  DOT_F32, SWAP_AB, PAIR_FMA)
    k = k0 + tl.arange(0, 128)
    if SWAP_AB:
        a = tl.load(a_ptr + a_rows[None, :] * K + k[:, None], mask=live[None, :] & (k[:, None] < K),
                    other=0.0)
    else:
        a = tl.load(a_ptr + a_rows[:, None] * K + k[None, :], mask=live[:, None] & (k[None, :] < K),
                    other=0.0)
    if DOT_F32:
        a = a.to(tl.float32)
    else:
        w = w.to(a.dtype)
    if SWAP_AB:
        acc = tl.dot(w, a, acc)
    else:
        acc = tl.dot(a, w, acc)
    return acc
