"""The expert GEMMs over routes sorted into BLOCK_M blocks of one expert each.

GEMM 1 gathers token rows of x, multiplies by the expert's gate and up tiles in the same program
and applies the activation in registers, so only the [rows, I] activation reaches memory. GEMM 2
reads those rows in sorted order, adds b2, multiplies by the route's top-k weight and writes one
row per route for the top-k sum. Weights are dequantized in registers. fp8 block scales multiply
the weight tile of each K step (w8a8 multiplies the fp32 partial product by both scales instead).
mxfp4 and int4 are read from the layout prepare_weights repacked them into (repacked_step: a
decode of few integer operations, one dot per K step, gate and up rows in one tile), or from the
checkpoint's: int4's group scales multiply each K step's tile, mxfp4 goes through Triton's
dot_scaled or fp32 bit patterns with the e8m0 exponent added."""

from __future__ import annotations

import triton
import triton.language as tl
from hal.backends.triton_moe import repacked_step, split_k
from hal.backends.triton_moe.quant import quantize_remainder, quantize_rows
from hal.backends.triton_moe.routing import local_expert

# Weight formats as the kernels know them (constexpr codes).
BF16, FP8_BLOCK, MXFP4, INT4 = 0, 1, 2, 3
# Activations.
SILU, SWIGLU_OAI, RELU2 = 0, 1, 2


@triton.jit
def _fp8_weight_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, offs_k, K, stride_we, stride_se,
                     scale_cols):
    """[BK, BN] e4m3 tile of a row-major [N, K] weight and the [BN] block scale of this K step
    (BK divides 128, so one scale column)."""
    mask = (offs_k[:, None] < K) & row_ok[None, :]
    w = tl.load(w_ptr + expert * stride_we + rows[None, :].to(tl.int64) * K + offs_k[:, None], mask=mask,
                other=0.0)
    s = tl.load(s_ptr + expert * stride_se + (rows // 128) * scale_cols + k0 // 128, mask=row_ok,
                other=0.0)
    return w, s


@triton.jit
def _fp8_weight_rows(w_ptr, s_ptr, expert, rows, row_ok, k0, offs_k, K, stride_we, stride_se,
                     scale_cols):
    """[BN, BK] e4m3 tile (rows of the row-major [N, K] weight, K contiguous as stored) and the
    [BN] block scale of this K step: the swap-AB order."""
    mask = row_ok[:, None] & (offs_k[None, :] < K)
    w = tl.load(w_ptr + expert * stride_we + rows[:, None].to(tl.int64) * K + offs_k[None, :], mask=mask,
                other=0.0)
    s = tl.load(s_ptr + expert * stride_se + (rows // 128) * scale_cols + k0 // 128, mask=row_ok,
                other=0.0)
    return w, s


@triton.jit
def _mxfp4_packed_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
                       BLOCK_K: tl.constexpr):
    """The packed [BK/2, BN] e2m1 bytes and [BN, BK/32] e8m0 scales of one K step, as dot_scaled
    takes them (bytes packed along K, the even k in the low nibble: the checkpoint's own order)."""
    half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    mask = (half[:, None] < K // 2) & row_ok[None, :]
    packed = tl.load(w_ptr + expert * stride_we + rows[None, :].to(tl.int64) * (K // 2) + half[:, None],
                     mask=mask, other=0)
    group = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    smask = row_ok[:, None] & (group[None, :] < K // 32)
    e8m0 = tl.load(s_ptr + expert * stride_se + rows[:, None].to(tl.int64) * (K // 32) + group[None, :],
                   mask=smask, other=0)
    return packed, e8m0


@triton.jit
def _mxfp4_packed_rows(w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
                       BLOCK_K: tl.constexpr):
    """The packed [BN, BK/2] e2m1 bytes (rows as stored, packed along K) and [BN, BK/32] e8m0
    scales of one K step: dot_scaled's first operand."""
    half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    mask = row_ok[:, None] & (half[None, :] < K // 2)
    packed = tl.load(w_ptr + expert * stride_we + rows[:, None].to(tl.int64) * (K // 2) + half[None, :],
                     mask=mask, other=0)
    group = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    smask = row_ok[:, None] & (group[None, :] < K // 32)
    e8m0 = tl.load(s_ptr + expert * stride_se + rows[:, None].to(tl.int64) * (K // 32) + group[None, :],
                   mask=smask, other=0)
    return packed, e8m0


@triton.jit
def _mxfp4_weight_tiles(w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
                        BLOCK_K: tl.constexpr):
    """The even-k and odd-k [BK/2, BN] fp32 tiles of an mxfp4 weight (bytes [N, K/2], the even k in
    the low nibble; e8m0 scales [N, K/32]), built as fp32 bit patterns with the e8m0 exponent added
    to the e2m1 one: exact, a few integer operations per value, no shuffles."""
    half = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    mask = (half[:, None] < K // 2) & row_ok[None, :]
    base = expert * stride_we + rows[None, :].to(tl.int64) * (K // 2)
    packed = tl.load(w_ptr + base + half[:, None], mask=mask, other=0).to(tl.int32)
    scale_base = expert * stride_se + rows[None, :].to(tl.int64) * (K // 32)
    e8m0 = tl.load(s_ptr + scale_base + (half // 16)[:, None], mask=mask, other=0).to(tl.int32)
    return _e2m1_scaled(packed & 0xF, e8m0), _e2m1_scaled(packed >> 4, e8m0)


@triton.jit
def _e2m1_scaled(nibble, e8m0):
    """fp4 e2m1 (sign, 2-bit exponent e, 1-bit mantissa m) times 2^(e8m0 - 127) as fp32: the
    biased fp32 exponent is e + e8m0 - 1 (e = 0 with m = 1 is 0.5: the same formula, mantissa 0).
    Results below fp32's normal range flush to zero."""
    magnitude = nibble & 7
    exponent = (magnitude >> 1) + e8m0 - 1
    mantissa = tl.where(magnitude >= 2, magnitude & 1, 0)
    bits = tl.where((magnitude == 0) | (exponent <= 0), 0, (exponent << 23) | (mantissa << 22))
    return (bits | ((nibble & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _int4_weight_tile(w_ptr, s_ptr, expert, cols, col_ok, k0, K, N_TOTAL, stride_we, stride_se,
                      group_size, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BK, BN] tile of (q - 8) from GPTQ qweight [K/8, N] (eight nibbles along K, lowest first)
    and the [BN] group scale of this K step (BK divides the group)."""
    packs = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    mask = (packs[:, None] < K // 8) & col_ok[None, :]
    q = tl.load(w_ptr + expert * stride_we + packs[:, None].to(tl.int64) * N_TOTAL + cols[None, :],
                mask=mask, other=0)
    shifts = tl.arange(0, 8) * 4
    nibbles = (q[:, None, :] >> shifts[None, :, None]) & 0xF
    w = tl.reshape(nibbles, (BLOCK_K, BLOCK_N)) - 8
    s = tl.load(s_ptr + expert * stride_se + (k0 // group_size) * N_TOTAL + cols, mask=col_ok, other=0.0)
    return w, s.to(tl.float32)


@triton.jit
def _dot_step(acc, a, a_scale, a_lo, w_ptr, s_ptr, expert, rows, row_ok, k0, offs_k, K,
              N_TOTAL, stride_we, stride_se, scale_cols, group_size, FORMAT: tl.constexpr,
              A_FP8: tl.constexpr, A_TERMS: tl.constexpr, DOT_F32: tl.constexpr,
              MXFP4_DOT_SCALED: tl.constexpr, A_FORMAT: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """acc += a @ W[rows, k0:k0+BK].T for one weight tile, dequantized per FORMAT. `a` is already
    in the dot dtype; a_scale is the per-row scale of an fp8-quantized `a` (A_FP8), and of its low
    terms a_lo (A_TERMS 2), whose dot chains on the high terms' before the scales. mxfp4 goes
    through Triton's dot_scaled (MXFP4_DOT_SCALED: the compiler upcasts e2m1 and applies the e8m0
    scales in its own layouts) or through the fp32 bit patterns below. SWAP_AB (fp8 and mxfp4
    through dot_scaled): acc is [BN, BM] and gets W @ a.T: the weights are the dot's first operand,
    which Hopper's wgmma reads from registers where they were dequantized there (w8a16), and the
    few rows of a decode block become the dot's N (wgmma's M is at least 64: as the first operand
    a 16-row block would fill a quarter of it)."""
    if SWAP_AB and FORMAT == 2:
        packed, e8m0 = _mxfp4_packed_rows(w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
                                          BLOCK_K)
        acc = tl.dot_scaled(packed, e8m0, "e2m1", tl.trans(a), None, A_FORMAT, acc)
    elif SWAP_AB and A_FP8:
        w, s = _fp8_weight_rows(w_ptr, s_ptr, expert, rows, row_ok, k0, offs_k, K, stride_we, stride_se,
                                scale_cols)
        if DOT_F32:
            w = w.to(tl.float32)
        product = tl.dot(w, tl.trans(a))
        if A_TERMS == 2:
            product = tl.dot(w, tl.trans(a_lo), product)
        acc += product * s[:, None] * a_scale[None, :]
    elif SWAP_AB:
        w, s = _fp8_weight_rows(w_ptr, s_ptr, expert, rows, row_ok, k0, offs_k, K, stride_we, stride_se,
                                scale_cols)
        acc = tl.dot((w.to(tl.float32) * s[:, None]).to(a.dtype), tl.trans(a), acc)
    elif FORMAT == 0:
        w = tl.load(w_ptr + expert * stride_we + rows[None, :].to(tl.int64) * K + offs_k[:, None],
                    mask=(offs_k[:, None] < K) & row_ok[None, :], other=0.0)
        acc = tl.dot(a, w.to(a.dtype), acc)
    elif FORMAT == 1:
        w, s = _fp8_weight_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, offs_k, K, stride_we, stride_se,
                                scale_cols)
        if A_FP8:
            if DOT_F32:
                w = w.to(tl.float32)
            product = tl.dot(a, w)
            if A_TERMS == 2:
                product = tl.dot(a_lo, w, product)
            acc += product * a_scale[:, None] * s[None, :]
        else:
            # Scaled before the dot, so the dots chain on one accumulator (asynchronous wgmma
            # stays in flight); the scaled weight is rounded to the activation dtype once.
            acc = tl.dot(a, (w.to(tl.float32) * s[None, :]).to(a.dtype), acc)
    elif FORMAT == 2 and MXFP4_DOT_SCALED:
        packed, e8m0 = _mxfp4_packed_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
                                          BLOCK_K)
        acc = tl.dot_scaled(a, None, A_FORMAT, packed, e8m0, "e2m1", acc)
    elif FORMAT == 2:
        w_even, w_odd = _mxfp4_weight_tiles(w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
                                            BLOCK_K)
        a_even, a_odd = tl.split(tl.reshape(a, (a.shape[0], BLOCK_K // 2, 2)))
        acc = tl.dot(a_even, w_even.to(a.dtype), acc)
        acc = tl.dot(a_odd, w_odd.to(a.dtype), acc)
    else:
        w, s = _int4_weight_tile(w_ptr, s_ptr, expert, rows, row_ok, k0, K, N_TOTAL, stride_we, stride_se,
                                 group_size, BLOCK_K, BLOCK_N)
        acc = tl.dot(a, (w.to(tl.float32) * s[None, :]).to(a.dtype), acc)
    return acc


@triton.jit
def _k_step(acc, acc_up, a_ptr, a_scale_ptr, a_rows, live, w_ptr, s_ptr, expert, gate_rows, up_rows, n_ok, k0,
            K, N_TOTAL, stride_we, stride_se, scale_cols, group_size, FORMAT: tl.constexpr,
            A_FP8: tl.constexpr, A_TERMS: tl.constexpr, A_QUANTIZED: tl.constexpr, DOT_F32: tl.constexpr,
            MXFP4_DOT_SCALED: tl.constexpr, A_FORMAT: tl.constexpr, GATED: tl.constexpr,
            BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """One BLOCK_K step of the gate (acc) and up (acc_up) products from a tile of `a` loaded once.
    A_TERMS 2 (w8a8 with each activation held as two e4m3 terms): a quantized row of `a` is its
    high terms, then its low terms (K each), both in units of the row's a_scale."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    terms: tl.constexpr = A_TERMS if A_QUANTIZED else 1  # e4m3 terms per value in a row of `a`
    row_ptr = a_ptr + a_rows[:, None] * (K * terms)
    scale_row = a_scale_ptr + a_rows * scale_cols + k0 // 128
    k_ok = live[:, None] & (offs_k[None, :] < K)
    a = tl.load(row_ptr + offs_k[None, :], mask=k_ok, other=0.0)
    a_scale = tl.zeros([a.shape[0]], dtype=tl.float32)
    a_lo = a
    if A_QUANTIZED:
        a_scale = tl.load(scale_row, mask=live, other=0.0)
        if A_TERMS == 2:
            a_lo = tl.load(row_ptr + K + offs_k[None, :], mask=k_ok, other=0.0)
    elif A_FP8:
        a32 = a.to(tl.float32)
        a, a_scale = quantize_rows(a32, w_ptr.dtype.element_ty)
        if A_TERMS == 2:
            a_lo = quantize_remainder(a32, a, a_scale, w_ptr.dtype.element_ty)
    if DOT_F32:
        a = a.to(tl.float32)
        if A_TERMS == 2:
            a_lo = a_lo.to(tl.float32)
    acc = _dot_step(acc, a, a_scale, a_lo, w_ptr, s_ptr, expert, gate_rows, n_ok, k0, offs_k, K,
                    N_TOTAL, stride_we, stride_se, scale_cols, group_size, FORMAT, A_FP8, A_TERMS, DOT_F32,
                    MXFP4_DOT_SCALED, A_FORMAT, BLOCK_K, BLOCK_N, SWAP_AB)
    if GATED:
        acc_up = _dot_step(acc_up, a, a_scale, a_lo, w_ptr, s_ptr, expert, up_rows, n_ok, k0,
                           offs_k, K, N_TOTAL, stride_we, stride_se, scale_cols, group_size, FORMAT, A_FP8,
                           A_TERMS, DOT_F32, MXFP4_DOT_SCALED, A_FORMAT, BLOCK_K, BLOCK_N, SWAP_AB)
    return acc, acc_up


@triton.jit
def moe_gemm_kernel(
    a_ptr, a_scale_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, out_scale_ptr, sorted_routes_ptr,
    block_expert_ptr, topk_weights_ptr, topk_ids_ptr, expert_map_ptr, ws_ptr, counter_ptr,
    num_routes, num_experts, N, K, N_TOTAL, stride_we, stride_se, scale_cols, group_size, gate_stride,
    up_offset, swiglu_alpha, swiglu_limit,
    FIRST: tl.constexpr, TOP_K: tl.constexpr, FORMAT: tl.constexpr, ACTIVATION: tl.constexpr,
    HAS_BIAS: tl.constexpr, A_FP8: tl.constexpr, A_TERMS: tl.constexpr, A_QUANTIZED: tl.constexpr,
    OUT_FP8: tl.constexpr, DOT_F32: tl.constexpr, MXFP4_DOT_SCALED: tl.constexpr,
    REPACKED: tl.constexpr, SCALE_HIGH: tl.constexpr, PAIR_FMA: tl.constexpr,
    A_FORMAT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr, PER_ROUTE: tl.constexpr, LOCAL_EXPERTS: tl.constexpr, HAS_MAP: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """FIRST: out[row] = act(x[token(row)] @ W13[e].T + b13) for the padded rows of one block
    (act of gate and up columns N apart, or interleaved with gate_stride 2). Else:
    out[route] = topk_weight[route] * (h[row] @ W2[e].T + b2).
    PER_ROUTE (few routes, no grouping launch): block b is route b alone, its expert read from
    topk_ids here, and h has one row per route (row = route).
    w8a8 (A_FP8, fp8 weights): fp8 x fp8 dots, the fp32 partial product of each 128-column K step
    times the row's activation scale and the weight block's scale; A_TERMS 2 (w8a8x2): each
    activation is two e4m3 terms in units of one scale, two chained dots per K step, a quantized row
    holding its high terms then its low terms (GEMM 1's fp8 epilogue writes both). A_QUANTIZED: `a`
    is e4m3 with fp32 scales a_scale [rows, scale_cols]; else each K step's tile is quantized here. OUT_FP8
    (FIRST, BLOCK_N 128: each N tile one 128-column group): h is written as e4m3 with its scales in
    out_scale [rows, cdiv(N, 128)], GEMM 2's input as it reads it, with no launch in between.
    SPLIT_K > 1 (grid axis 1, few blocks): each split walks its share of K and the last to arrive
    runs the epilogue on the sums (split_k.py); ws_ptr holds the partials, counter_ptr zeros."""
    # N tiles vary fastest: programs running together share one block's activation rows and walk
    # one expert's weights, so both stay in L2 (GEMM 2's [rows, I] input is larger than L2 at
    # prefill and would otherwise be read once per N tile).
    # GROUP_M > 1 (prefill): GROUP_M blocks walk the N tiles together, so a weight tile is read
    # once for all of them while in L2.
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    if GROUP_M == 1:
        pid_m = pid // tiles_n
        pid_n = pid % tiles_n
    else:
        blocks = tl.num_programs(0) // tiles_n
        first_m = (pid // (GROUP_M * tiles_n)) * GROUP_M
        # Not `group_size`: that argument is int4's quantization group, read by every K step.
        blocks_in_group = tl.minimum(blocks - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * tiles_n)) % blocks_in_group
        pid_n = (pid % (GROUP_M * tiles_n)) // blocks_in_group
    if PER_ROUTE:
        expert = local_expert(topk_ids_ptr, expert_map_ptr, pid_m, num_routes, num_experts, LOCAL_EXPERTS,
                              HAS_MAP)
        route = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_routes)
        rows_m = route  # h's row of a route is the route
    else:
        expert = tl.load(block_expert_ptr + pid_m)
        rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        route = tl.load(sorted_routes_ptr + rows_m)
    if expert < 0:
        return
    expert = expert.to(tl.int64)
    live = route < num_routes
    if FIRST:
        a_rows = (route // TOP_K).to(tl.int64)
    else:
        a_rows = rows_m.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    GATED: tl.constexpr = FIRST and ACTIVATION != 2
    gate_rows = offs_n * gate_stride
    up_rows = gate_rows + up_offset
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if REPACKED:
        tl.static_assert(BLOCK_K == 128, "the repacked words hold 128-wide K steps")
    # Repacked weights keep gate row n next to up row n (prepare_weights interleaves them): GEMM 1
    # takes both in one dot over 2 x BLOCK_N rows and splits the columns after the loop.
    PAIRED: tl.constexpr = REPACKED and GATED
    if PAIRED:
        pair_rows = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)
        pair_ok = pair_rows < 2 * N
        if SWAP_AB:
            acc_pair = tl.zeros([2 * BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            acc_pair = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
    # K > 0 (the layer's sizes are positive). Unknown, the loop may run zero times, and the zeros the
    # accumulators keep on that path make ptxas serialize every wgmma of the loop (its C7515: repacked
    # mxfp4's GEMM 2, whose decoded weights are wgmma's register operand).
    tl.assume(K > 0)
    k_lo = 0
    k_hi = K
    if SPLIT_K > 1:
        k_lo, k_hi = split_k.k_range(K, BLOCK_K, SPLIT_K)
        tl.assume(k_hi > k_lo)  # the launch holds split_k to at most the K steps
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if PAIRED:
            acc_pair = repacked_step.dot_step(acc_pair, a_ptr, a_rows, live, w_ptr, s_ptr, expert, pair_rows,
                                              pair_ok, k0, K, N_TOTAL, stride_we, stride_se, FORMAT == 3,
                                              SCALE_HIGH, DOT_F32, SWAP_AB, PAIR_FMA)
        elif REPACKED:
            acc = repacked_step.dot_step(acc, a_ptr, a_rows, live, w_ptr, s_ptr, expert, gate_rows, n_ok, k0,
                                         K, N_TOTAL, stride_we, stride_se, FORMAT == 3, SCALE_HIGH, DOT_F32,
                                         SWAP_AB, PAIR_FMA)
        else:
            acc, acc_up = _k_step(acc, acc_up, a_ptr, a_scale_ptr, a_rows, live, w_ptr, s_ptr, expert,
                                  gate_rows, up_rows, n_ok, k0, K, N_TOTAL, stride_we, stride_se, scale_cols,
                                  group_size, FORMAT, A_FP8, A_TERMS, A_QUANTIZED, DOT_F32, MXFP4_DOT_SCALED,
                                  A_FORMAT, GATED, BLOCK_K, BLOCK_N, SWAP_AB)
    if SPLIT_K > 1:
        PARTS: tl.constexpr = 2 if GATED and not PAIRED else 1
        if PAIRED:
            split_k.park(acc_pair, ws_ptr, pid, 0, PARTS, SPLIT_K)
        else:
            split_k.park(acc, ws_ptr, pid, 0, PARTS, SPLIT_K)
            if GATED:
                split_k.park(acc_up, ws_ptr, pid, 1, PARTS, SPLIT_K)
        if not split_k.arrive(counter_ptr, pid, SPLIT_K):
            return
        if PAIRED:
            acc_pair = split_k.ordered_sum(acc_pair, ws_ptr, pid, 0, PARTS, SPLIT_K)
        else:
            acc = split_k.ordered_sum(acc, ws_ptr, pid, 0, PARTS, SPLIT_K)
            if GATED:
                acc_up = split_k.ordered_sum(acc_up, ws_ptr, pid, 1, PARTS, SPLIT_K)
    if PAIRED:
        if SWAP_AB:
            acc_pair = tl.trans(acc_pair)
        if HAS_BIAS:
            acc_pair += tl.load(bias_ptr + expert * N_TOTAL + pair_rows, mask=pair_ok, other=0.0)[None, :]
        acc, acc_up = tl.split(tl.reshape(acc_pair, [BLOCK_M, BLOCK_N, 2]))
    else:
        if SWAP_AB:
            acc = tl.trans(acc)
            acc_up = tl.trans(acc_up)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + expert * N_TOTAL + gate_rows, mask=n_ok, other=0.0)[None, :]
            if GATED:
                acc_up += tl.load(bias_ptr + expert * N_TOTAL + up_rows, mask=n_ok, other=0.0)[None, :]
    out_mask = live[:, None] & n_ok[None, :]
    if FIRST:
        if ACTIVATION == 0:
            h = acc * tl.sigmoid(acc) * acc_up
        elif ACTIVATION == 1:
            gate = tl.minimum(acc, swiglu_limit)
            up = tl.clamp(acc_up, -swiglu_limit, swiglu_limit)
            h = gate * tl.sigmoid(swiglu_alpha * gate) * (up + 1.0)
        else:
            h = tl.maximum(acc, 0.0)
            h = h * h
        if OUT_FP8:
            # Columns past N hold zeros (their weight rows and bias were masked to 0, and every
            # activation maps 0 to 0), so they do not change a row's max.
            tl.static_assert(BLOCK_N == 128, "the fp8 epilogue quantizes one 128-column group per tile")
            if A_TERMS == 1:
                # w8a8 (act_quant fp8_g128) quantizes the activation as the layer stores it between
                # the GEMMs, in the activations' 16-bit dtype, as GEMM 2 does where h is stored.
                if A_FORMAT == "fp16":
                    h = h.to(tl.float16).to(tl.float32)
                else:
                    h = h.to(tl.bfloat16).to(tl.float32)
            q, scale = quantize_rows(h, out_ptr.dtype.element_ty)
            out_row = out_ptr + rows_m[:, None].to(tl.int64) * (N * A_TERMS) + offs_n[None, :]
            tl.store(out_row, q, mask=out_mask)
            tl.store(out_scale_ptr + rows_m.to(tl.int64) * tl.cdiv(N, 128) + pid_n, scale, mask=live)
            if A_TERMS == 2:
                tl.store(out_row + N, quantize_remainder(h, q, scale, out_ptr.dtype.element_ty),
                         mask=out_mask)
        else:
            tl.store(out_ptr + rows_m[:, None].to(tl.int64) * N + offs_n[None, :],
                     h.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        weight = tl.load(topk_weights_ptr + route, mask=live, other=0.0).to(tl.float32)
        y = acc * weight[:, None]
        tl.store(out_ptr + route[:, None].to(tl.int64) * N + offs_n[None, :],
                 y.to(out_ptr.dtype.element_ty), mask=out_mask)
