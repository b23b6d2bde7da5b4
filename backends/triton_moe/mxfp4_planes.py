"""mxfp4 weights repacked for the tensor cores: eight 16-wide K planes per 32-bit word.

The checkpoint stores e2m1 nibbles two per byte along K (even k low) with one e8m0 exponent per 32
values of K. `repack` (once, in prepare_weights) rewrites each 128-wide K step of a row as 16
int32 words: nibble j (bits 4j..4j+3) of word r is the value at k = 128 s + 16 j + r, so nibble j
of the 16 words of a step is one 16-wide K plane, a whole tensor-core K step whose values share
one scale (group 4 s + j // 2). Scales are stored [groups, N] so a tile's are one contiguous load.

Decoding is exact and branch-free: an e2m1 nibble s|e1 e0|m moved to bf16's sign bit and to bits
6..8 (the low two exponent bits and the top mantissa bit) is the bf16 of its value times 2^-126,
the normal values (e > 0) and the subnormal 0.5 (e = 0, m = 1, bf16's subnormal 2^-127) alike.
Nibbles j and j + 4 sit 16 bits apart in the word, so four integer operations build both bf16
patterns in one 32-bit value, and a shift or a mask makes each the fp32 of the same value. The
2^126 goes into the scale: one fp32 multiply by 2^(e8m0 - 1), exact, then one rounding-free
conversion to bf16 (the product has two significant bits)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

STEP_K = 128  # K values per step: 16 words of a row
WORDS_PER_STEP = 16
PLANE_K = 16  # K values per plane: one tensor-core K step of 16-bit operands
PLANES = 8  # nibbles per word
GROUP = 32  # K values per e8m0 scale
# e8m0 values above this make 2^(e8m0 - 1) overflow fp32; a tensor holding any is scaled in two
# multiplies (`SCALE_HIGH`).
ONE_MULTIPLY_MAX_E8M0 = 128
REPACK_EXPERTS = 8  # experts repacked at a time: bounds the int64 temporaries


def steps(k: int) -> int:
    return triton.cdiv(k, STEP_K)


def repack(packed: torch.Tensor, e8m0: torch.Tensor, k_pairs: bool = False) -> tuple:
    """Checkpoint mxfp4 ([E, N, K/2] uint8, even k in the low nibble; e8m0 [E, N, K/32]) to
    (words [E, N, steps * 16] int32, scales [E, steps * 4, N] uint8, scale_high). Values past K are
    zero nibbles, their scales zero."""
    E, N, half = packed.shape
    K = 2 * half
    S = steps(K)
    words = torch.empty(E, N, S * WORDS_PER_STEP, dtype=torch.int32, device=packed.device)
    shifts = (4 * torch.arange(PLANES, device=packed.device, dtype=torch.int64)).view(1, 1, 1, PLANES, 1)
    for e0 in range(0, E, REPACK_EXPERTS):
        p = packed[e0:e0 + REPACK_EXPERTS].to(torch.int64)
        nibbles = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(p.shape[0], N, K)
        nibbles = torch.nn.functional.pad(nibbles, (0, S * STEP_K - K))
        if k_pairs:
            # k = 32 j + 2 r + b -> word r, nibble j + 4 b
            nibbles = nibbles.view(p.shape[0], N, S, 4, WORDS_PER_STEP, 2).permute(0, 1, 2, 5, 3, 4)
            nibbles = nibbles.reshape(p.shape[0], N, S, PLANES, WORDS_PER_STEP)
        else:
            nibbles = nibbles.view(p.shape[0], N, S, PLANES, WORDS_PER_STEP)
        word = (nibbles << shifts).sum(dim=3)  # [e, N, S, 16], < 2^32
        word = torch.where(word >= 2**31, word - 2**32, word)
        words[e0:e0 + REPACK_EXPERTS] = word.reshape(p.shape[0], N, S * WORDS_PER_STEP).to(torch.int32)
    groups = S * (STEP_K // GROUP)
    scales = torch.nn.functional.pad(e8m0, (0, groups - e8m0.shape[2])).transpose(1, 2).contiguous()
    return words, scales, bool((e8m0 > ONE_MULTIPLY_MAX_E8M0).any())


@triton.jit
def _scale_factors(s_ptr, expert, stride_se, group, rows, row_ok, N_TOTAL, SCALE_HIGH: tl.constexpr):
    """2^(e8m0 - 1) as fp32 for `rows` (the 2^126 of the decode folded in): one factor, or two
    (2^(min(e, 128) - 1) and 2^max(e - 128, 0)) where a tensor holds larger exponents."""
    e = tl.load(s_ptr + expert * stride_se + group * N_TOTAL + rows, mask=row_ok, other=0).to(tl.int32)
    low = ((tl.minimum(e, 128) + 126) << 23).to(tl.float32, bitcast=True)
    if SCALE_HIGH:
        high = ((tl.maximum(e - 128, 0) + 127) << 23).to(tl.float32, bitcast=True)
    else:
        high = low
    return low, high


@triton.jit
def _plane_pair(words, jj: tl.constexpr):
    """Planes jj and jj + 4 of the words as fp32, each value times 2^-126: bf16 patterns built in
    the low and high halves of one int32 (magnitude bits to 6..8 and 22..24, sign bits to 15 and
    31), then each half moved to the top of an fp32."""
    if jj < 2:
        mag = words << (6 - 4 * jj)
    else:
        mag = words >> (4 * jj - 6)
    sign = words << (12 - 4 * jj)
    pair = (mag & 0x01C001C0) | (sign & -0x7FFF8000)  # -0x7FFF8000: 0x80008000 as int32
    return (pair << 16).to(tl.float32, bitcast=True), (pair & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _scaled(plane, low, high, SCALE_HIGH: tl.constexpr, SWAP_AB: tl.constexpr):
    if SWAP_AB:
        plane = plane * low[:, None]
        if SCALE_HIGH:
            plane = plane * high[:, None]
    else:
        plane = plane * low[None, :]
        if SCALE_HIGH:
            plane = plane * high[None, :]
    return plane


@triton.jit
def _plane_dot(acc, a_ptr, a_rows, live, k, K, w, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr):
    """acc += x[:, k:k+16] @ w (w [16, BN]), or w @ x[:, k:k+16].T (w [BN, 16]) with SWAP_AB."""
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


@triton.jit
def planes_step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we,
                stride_se, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr):
    """One 128-wide K step of acc += x @ W[rows].T (acc [BM, BN], or [BN, BM] with SWAP_AB) from
    the repacked words: eight 16-wide dots, each plane decoded, scaled and rounded once."""
    step = k0 // 128
    r = tl.arange(0, 16)
    row_words = expert * stride_we + rows.to(tl.int64) * (tl.cdiv(K, 128) * 16) + step * 16
    if SWAP_AB:
        words = tl.load(w_ptr + row_words[:, None] + r[None, :], mask=row_ok[:, None], other=0)
    else:
        words = tl.load(w_ptr + row_words[None, :] + r[:, None], mask=row_ok[None, :], other=0)
    for jj in tl.static_range(4):
        lo, hi = _plane_pair(words, jj)
        low, high = _scale_factors(s_ptr, expert, stride_se, step * 4 + jj // 2, rows, row_ok, N_TOTAL,
                                   SCALE_HIGH)
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + 16 * jj + r, K,
                         _scaled(lo, low, high, SCALE_HIGH, SWAP_AB), DOT_F32, SWAP_AB)
        low, high = _scale_factors(s_ptr, expert, stride_se, step * 4 + 2 + jj // 2, rows, row_ok, N_TOTAL,
                                   SCALE_HIGH)
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + 16 * (jj + 4) + r, K,
                         _scaled(hi, low, high, SCALE_HIGH, SWAP_AB), DOT_F32, SWAP_AB)
    return acc


@triton.jit
def _k_pairs_tile(words, jj: tl.constexpr, e, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr,
                  SWAP_AB: tl.constexpr):
    """The 32 values of scale group jj of a step from its 16 words ([BN, 16], or [16, BN] unless
    SWAP_AB): pair jj of word r holds k = 32 jj + 2 r (low half) and the next k (high half), so the
    halves are adjacent k as the tensor cores take them. Returns [BN, 32] (SWAP_AB) or [32, BN] in
    the dot's dtype (fp32 if DOT_F32)."""
    if jj < 2:
        mag = words << (6 - 4 * jj)
    else:
        mag = words >> (4 * jj - 6)
    sign = words << (12 - 4 * jj)
    pair = (mag & 0x01C001C0) | (sign & -0x7FFF8000)
    if SWAP_AB:
        e = e[:, None]
    else:
        e = e[None, :]
    low = ((tl.minimum(e, 128) + 126) << 23).to(tl.float32, bitcast=True)
    lo = (pair << 16).to(tl.float32, bitcast=True) * low
    hi = (pair & -65536).to(tl.float32, bitcast=True) * low
    if SCALE_HIGH:
        high = ((tl.maximum(e - 128, 0) + 127) << 23).to(tl.float32, bitcast=True)
        lo = lo * high
        hi = hi * high
    if not DOT_F32:
        # Exact: two significant bits. lo and hi are adjacent k, one bf16x2 conversion.
        lo = lo.to(tl.bfloat16)
        hi = hi.to(tl.bfloat16)
    both = tl.join(lo, hi)
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
def step_tile(t0, t1, t2, t3, SWAP_AB: tl.constexpr):
    """The four groups' tiles joined along K: the whole 128-wide step."""
    return _cat_k(_cat_k(t0, t1, SWAP_AB), _cat_k(t2, t3, SWAP_AB), SWAP_AB)


@triton.jit
def k_pairs_step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we,
                 stride_se, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr,
                 DOT_K: tl.constexpr):
    """planes_step for the k-pairs layout (repack(k_pairs=True)): each scale group's 32 values
    decoded from the step's 16 words (one bf16x2 multiply per two values), DOT_K of them per dot
    (32, 64 or 128: one to four groups joined along K)."""
    step = k0 // 128
    r = tl.arange(0, 16)
    row_words = expert * stride_we + rows.to(tl.int64) * (tl.cdiv(K, 128) * 16) + step * 16
    if SWAP_AB:
        words = tl.load(w_ptr + row_words[:, None] + r[None, :], mask=row_ok[:, None], other=0)
    else:
        words = tl.load(w_ptr + row_words[None, :] + r[:, None], mask=row_ok[None, :], other=0)
    scales = s_ptr + expert * stride_se + (step * 4) * N_TOTAL + rows
    e0 = tl.load(scales, mask=row_ok, other=0).to(tl.int32)
    e1 = tl.load(scales + N_TOTAL, mask=row_ok, other=0).to(tl.int32)
    e2 = tl.load(scales + 2 * N_TOTAL, mask=row_ok, other=0).to(tl.int32)
    e3 = tl.load(scales + 3 * N_TOTAL, mask=row_ok, other=0).to(tl.int32)
    t0 = _k_pairs_tile(words, 0, e0, SCALE_HIGH, DOT_F32, SWAP_AB)
    t1 = _k_pairs_tile(words, 1, e1, SCALE_HIGH, DOT_F32, SWAP_AB)
    t2 = _k_pairs_tile(words, 2, e2, SCALE_HIGH, DOT_F32, SWAP_AB)
    t3 = _k_pairs_tile(words, 3, e3, SCALE_HIGH, DOT_F32, SWAP_AB)
    if DOT_K == 32:
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + tl.arange(0, 32), K, t0, DOT_F32, SWAP_AB)
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + 32 + tl.arange(0, 32), K, t1, DOT_F32, SWAP_AB)
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + 64 + tl.arange(0, 32), K, t2, DOT_F32, SWAP_AB)
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + 96 + tl.arange(0, 32), K, t3, DOT_F32, SWAP_AB)
    elif DOT_K == 64:
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + tl.arange(0, 64), K, _cat_k(t0, t1, SWAP_AB),
                         DOT_F32, SWAP_AB)
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + 64 + tl.arange(0, 64), K, _cat_k(t2, t3, SWAP_AB),
                         DOT_F32, SWAP_AB)
    else:
        acc = _plane_dot(acc, a_ptr, a_rows, live, k0 + tl.arange(0, 128), K,
                         step_tile(t0, t1, t2, t3, SWAP_AB), DOT_F32, SWAP_AB)
    return acc


@triton.jit
def step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we, stride_se,
         SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr, K_PAIRS: tl.constexpr):
    if K_PAIRS:
        acc = k_pairs_step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL,
                           stride_we, stride_se, SCALE_HIGH, DOT_F32, SWAP_AB, K_PAIRS)
    else:
        acc = planes_step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL,
                          stride_we, stride_se, SCALE_HIGH, DOT_F32, SWAP_AB)
    return acc
