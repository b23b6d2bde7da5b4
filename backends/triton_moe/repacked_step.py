"""The GEMMs' K step over 4-bit weights in repacked_words' layout (mxfp4 or int4): a 128-wide step
of weight rows loaded as 16 words and one scale int32 per row, decoded by the format's group_tile,
and its four 32-wide groups joined along K into one tile for one dot."""

from __future__ import annotations

import triton
import triton.language as tl
from hal.backends.triton_moe import int4_repacked, mxfp4_repacked


@triton.jit
def _pairs(even, odd, SWAP_AB: tl.constexpr):
    """A group's even-k and odd-k values (each [rows, 16] with SWAP_AB, else [16, rows]) as one
    [rows, 32] tile (else [32, rows]), k = 2 r + b."""
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
def _group(words, j: tl.constexpr, scales, INT4: tl.constexpr, HALF: tl.constexpr,
           SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr, PAIR_FMA: tl.constexpr):
    if INT4:
        even, odd = int4_repacked.group_tile(words, j, scales, HALF, DOT_F32, SWAP_AB, PAIR_FMA)
    else:
        even, odd = mxfp4_repacked.group_tile(words, j, scales, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    return _pairs(even, odd, SWAP_AB)


@triton.jit
def step_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, N_TOTAL, stride_we, stride_se, INT4: tl.constexpr,
              HALF: tl.constexpr, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr,
              PAIR_FMA: tl.constexpr):
    """The weight rows' 128-wide K step at k0, decoded and scaled: [rows, 128] with SWAP_AB (the
    dot's first operand), else [128, rows]. INT4: int4_repacked's format (HALF: its scales' dtype),
    else mxfp4_repacked's (SCALE_HIGH: some e8m0 takes two multiplies)."""
    step = k0 // 128
    r = tl.arange(0, 16)
    row_words = expert * stride_we + step * (N_TOTAL * 16) + rows.to(tl.int64) * 16
    if SWAP_AB:
        words = tl.load(w_ptr + row_words[:, None] + r[None, :], mask=row_ok[:, None], other=0)
    else:
        words = tl.load(w_ptr + row_words[None, :] + r[:, None], mask=row_ok[None, :], other=0)
    scales = tl.load(s_ptr + expert * stride_se + step * N_TOTAL + rows, mask=row_ok, other=0)
    t0 = _group(words, 0, scales, INT4, HALF, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    t1 = _group(words, 1, scales, INT4, HALF, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    t2 = _group(words, 2, scales, INT4, HALF, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    t3 = _group(words, 3, scales, INT4, HALF, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
    return _cat_k(_cat_k(t0, t1, SWAP_AB), _cat_k(t2, t3, SWAP_AB), SWAP_AB)


@triton.jit
def dot_step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we,
             stride_se, INT4: tl.constexpr, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr,
             SWAP_AB: tl.constexpr, PAIR_FMA: tl.constexpr):
    """acc += x[a_rows, k0:k0+128] @ W[rows, k0:k0+128].T (acc [BM, rows]), or W @ x.T into
    acc [rows, BM] with SWAP_AB, the decoded weights as the dot's register operand."""
    w = step_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, N_TOTAL, stride_we, stride_se, INT4,
                  a_ptr.dtype.element_ty, SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
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
