"""int4 (GPTQ uint4b8) weights repacked once for the tensor cores, and their decode in registers.

The checkpoint stores eight nibbles q per int32 along K ([K/8, N], lowest first) with one 16-bit
scale s (the activations' dtype) per 128 values of K, or one per column. `repack` (in
prepare_weights) rewrites them in repacked_words' layout (16 int32 words per 128-wide K step of a
row, step-major) with one int32 per row and step holding the step's scale in both halves ([steps,
N]). Group j's pair of a word sits at bits 4 j (even k) and 16 + 4 j (odd k), so one shift and one
mask give both nibbles of the pair in the low bits of their halves. K is padded to whole steps with
nibbles 8, which decode to 0.

On NVIDIA (PAIR_FMA, 16-bit dots) the decode is Marlin's: one `lop3` ORs the masked nibbles into the
mantissa of a 16-bit power of two P (bf16 128, fp16 1024: P + q in both halves), one packed FMA
subtracts P + 8 (exact: q - 8), and one packed FMA by the scale pair and -0 scales both halves, the
exact product rounded once to the dot's dtype, as the reference's `(q - 8) * s` in that dtype
rounds it. Elsewhere each half is q - 8 in fp32 times the fp32 scale, exact (|q - 8| has at most 3
significant bits, s 11), rounded once where the dot's operand is converted. The four groups of a
step are joined along K into one [rows, 128] tile by repacked_step: one dot per K step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hal.backends.triton_moe import repacked_words
from hal.backends.triton_moe.repacked_words import GROUPS_PER_STEP

ZERO_NIBBLE = 8  # uint4b8's zero: the padding past K
# repacked_words.pack's placement: nibble bit i of group j's half b at word bit 16 b + 4 j + i.
WORD_BITS = tuple((j, b, i, 16 * b + 4 * j + i) for j in range(GROUPS_PER_STEP) for b in range(2)
                  for i in range(4))
# The 16-bit bits of P (bf16 128, fp16 1024), 1 and -(P + 8), per PTX type.
_PAIR_CONSTANTS = {"bf16": (0x4300, 0x3F80, 0xC308), "f16": (0x6400, 0x3C00, 0xE408)}


def _pair_ptx(kind: str) -> tl.constexpr:
    """A pair decoded and scaled: t = ($1 & 0x000F000F) | (P, P) is (P + q, P + q') in the 16-bit
    type; t * 1 - (P + 8) is (q - 8, q' - 8), exact; times the scale pair $2, plus -0, into $0."""
    p, one, bias = (f"0x{h:04X}{h:04X}" for h in _PAIR_CONSTANTS[kind])
    return tl.constexpr(f"""
{{
.reg .b32 t, one, bias, negzero;
mov.b32 one, {one};
mov.b32 bias, {bias};
mov.b32 negzero, 0x80008000;
lop3.b32 t, $1, 0x000F000F, {p}, 0xEA;
fma.rn.{kind}x2 t, t, one, bias;
fma.rn.{kind}x2 $0, t, $2, negzero;
}}
""")


_BF16_PAIR_PTX = _pair_ptx("bf16")
_FP16_PAIR_PTX = _pair_ptx("f16")


def repack(qweight: torch.Tensor, scales: torch.Tensor) -> tuple:
    """Checkpoint int4 (qweight [E, K/8, N] int32, eight nibbles along K, lowest first; scales
    [E, G, N] 16-bit, G = K/128 or 1) to (words [E, steps, N, 16] int32, scale pairs [E, steps, N]
    int32). Past K: nibbles 8."""
    E, packs, N = qweight.shape
    K = packs * 8
    S = repacked_words.steps(K)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)

    def nibbles(e0: int, e1: int) -> torch.Tensor:
        q = (qweight[e0:e1].unsqueeze(-2) >> shifts.view(-1, 1)) & 0xF  # [e, K/8, 8, N]
        return q.flatten(1, 2).transpose(1, 2)

    words = repacked_words.pack(nibbles, E, N, K, WORD_BITS, ZERO_NIBBLE, qweight.device)
    if scales.shape[1] == 1:
        scales = scales.expand(E, S, N)
    bits = scales.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    pairs = bits | (bits << 16)
    return words, torch.where(pairs >= 2**31, pairs - 2**32, pairs).to(torch.int32).contiguous()


@triton.jit
def group_tile(words, j: tl.constexpr, scales, HALF: tl.constexpr, DOT_F32: tl.constexpr,
               SWAP_AB: tl.constexpr, PAIR_FMA: tl.constexpr):
    """Group j of a step from its 16 words ([rows, 16] with SWAP_AB, else [16, rows]) and the rows'
    scale pairs (HALF: their 16-bit dtype, tl.bfloat16 or tl.float16): its even-k and odd-k values,
    each shaped as the words, in HALF with PAIR_FMA (NVIDIA's inline PTX), else fp32."""
    if SWAP_AB:
        scales = scales[:, None]
    else:
        scales = scales[None, :]
    shifted = words >> (4 * j)
    if PAIR_FMA:
        tl.static_assert(not DOT_F32, "the packed FMAs write 16-bit pairs")
        ptx: tl.constexpr = _BF16_PAIR_PTX if HALF == tl.bfloat16 else _FP16_PAIR_PTX
        pair = tl.inline_asm_elementwise(ptx, "=r,r,r", [shifted, scales], dtype=tl.int32, is_pure=True,
                                         pack=1)
        even = pair.to(tl.int16).to(HALF, bitcast=True)
        odd = (pair >> 16).to(tl.int16).to(HALF, bitcast=True)
    else:
        scale = scales.to(tl.int16).to(HALF, bitcast=True).to(tl.float32)
        even = ((shifted & 0xF) - 8).to(tl.float32) * scale
        odd = (((shifted >> 16) & 0xF) - 8).to(tl.float32) * scale
    return even, odd
