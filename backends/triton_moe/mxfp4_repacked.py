"""mxfp4 weights repacked once for the tensor cores, and their exact decode in registers.

The checkpoint stores e2m1 nibbles two per byte along K (even k low) with one e8m0 exponent per 32
values of K. `repack` (in prepare_weights) rewrites them in repacked_words' layout (16 int32 words
per 128-wide K step of a row, step-major) with one int32 of scales per step ([steps, N]): byte j is
group j's e8m0. K is padded to whole steps with zero nibbles and zero scales.

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
[rows, 128] tile by repacked_step: one dot per K step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hal.backends.triton_moe import repacked_words
from hal.backends.triton_moe.repacked_words import GROUPS_PER_STEP, int32

# Above this e8m0, 2^(e8m0 - 1) overflows fp32: a weight holding one is scaled in two multiplies.
ONE_MULTIPLY_MAX_E8M0 = tl.constexpr(128)

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
# repacked_words.pack's placement: a pattern bit rotated right by its part's rotation.
WORD_BITS = tuple((j, bit // 16, NIBBLE_BIT[bit % 16], (bit - rotation) % 32)
                  for j, parts in enumerate(PAIR_PARTS) for rotation, mask in parts
                  for bit in range(32) if mask >> bit & 1)

_PATTERN = tl.constexpr(int32(PATTERN))
_ROTATION_1 = tl.constexpr(ROTATIONS[1])
_ROTATION_2 = tl.constexpr(ROTATIONS[2])
_SPLIT_ROTATION_A = tl.constexpr(SPLIT_PARTS[0][0])
_SPLIT_MASK_A = tl.constexpr(int32(SPLIT_PARTS[0][1]))
_SPLIT_ROTATION_B = tl.constexpr(SPLIT_PARTS[1][0])
_SPLIT_MASK_B = tl.constexpr(int32(SPLIT_PARTS[1][1]))
# $0 = $1 * $2 + (-0, -0) on a pair of bf16 (sm_80+): both halves of a decoded word scaled at once.
_PAIR_FMA_PTX = tl.constexpr("""
{
.reg .b32 negzero;
mov.b32 negzero, 0x80008000;
fma.rn.bf16x2 $0, $1, $2, negzero;
}
""")


def repack(packed: torch.Tensor, e8m0: torch.Tensor) -> tuple:
    """Checkpoint mxfp4 ([E, N, K/2] uint8, even k in the low nibble; e8m0 [E, N, K/32]) to
    (words [E, steps, N, 16] int32, scales [E, steps, N] int32, scale_high: some e8m0 above
    ONE_MULTIPLY_MAX_E8M0). Past K: zero nibbles, zero scales."""
    E, N, half = packed.shape
    S = repacked_words.steps(2 * half)

    def nibbles(e0: int, e1: int) -> torch.Tensor:
        p = packed[e0:e1].to(torch.int32)
        return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(e1 - e0, N, 2 * half)

    words = repacked_words.pack(nibbles, E, N, 2 * half, WORD_BITS, 0, packed.device)
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
    rows' scales int32 (byte j: the group's e8m0): its even-k and odd-k values, each shaped as the
    words, in bf16 (fp32 with DOT_F32). PAIR_FMA: scaled by bf16x2 FMAs (NVIDIA's inline PTX; not
    with DOT_F32)."""
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
    return even, odd
