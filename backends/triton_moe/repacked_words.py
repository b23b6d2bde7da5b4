"""The word layout that 4-bit weights are repacked into once, for the tensor cores (mxfp4_repacked,
int4_repacked).

Each 128-wide K step of a weight row becomes 16 int32 words, stored step-major ([E, steps, N, 16]):
the rows of a tile's step are one contiguous run (64 bytes each), not 64 bytes at a stride of the
row's length. Word r holds the values k = 32 j + 2 r + b of the step's four 32-wide groups j (b = 0
in the word's low half, 1 in its high half), so group j is 16 pairs of adjacent k, the way a tensor
core takes two 16-bit values from one 32-bit register. Where within its half each nibble's bits sit
is the format's choice (its WORD_BITS), made so that its decode takes few operations. K is padded
to whole steps with a nibble the format names."""

from __future__ import annotations

import torch
import triton

STEP_K = 128  # K values per step: 16 words of a row
WORDS_PER_STEP = 16
GROUPS_PER_STEP = 4  # 32-wide K groups per step, one per nibble position of a half
# Values packed at a time (whole experts, at least one): bounds the int64 temporaries to about 1 GiB
# (8 experts of gpt-oss-120b's w13, one of mixtral-8x7b's).
REPACK_VALUES = 1 << 27


def steps(k: int) -> int:
    return triton.cdiv(k, STEP_K)


def int32(bits: int) -> int:
    """An unsigned 32-bit pattern as the int32 that holds it."""
    return bits - (1 << 32) if bits >= 1 << 31 else bits


def pack(nibbles_of, experts: int, n: int, k: int, word_bits: tuple, pad_nibble: int,
         device) -> torch.Tensor:
    """4-bit values to words [experts, steps, n, 16] int32, about REPACK_VALUES values at a time:
    nibbles_of(e0, e1) gives experts e0..e1-1's values [e, n, k] (any integer dtype, 0..15);
    word_bits: (group j, half b, nibble bit, word bit) for every bit a word holds."""
    S = steps(k)
    words = torch.empty(experts, S, n, WORDS_PER_STEP, dtype=torch.int32, device=device)
    chunk = max(1, REPACK_VALUES // (n * S * STEP_K))
    for e0 in range(0, experts, chunk):
        e1 = min(experts, e0 + chunk)
        part = torch.nn.functional.pad(nibbles_of(e0, e1).to(torch.int64), (0, S * STEP_K - k),
                                       value=pad_nibble)
        # k = 32 j + 2 r + b within a step -> group j, word r, half b
        part = part.view(e1 - e0, n, S, GROUPS_PER_STEP, WORDS_PER_STEP, 2)
        word = torch.zeros(e1 - e0, n, S, WORDS_PER_STEP, dtype=torch.int64, device=device)
        for j, b, nibble_bit, word_bit in word_bits:
            word |= ((part[:, :, :, j, :, b] >> nibble_bit) & 1) << word_bit
        word = torch.where(word >= 2**31, word - 2**32, word)
        words[e0:e1] = word.transpose(1, 2).to(torch.int32)
    return words
