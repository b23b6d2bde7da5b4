"""The decode path: when a call has so few routes that experts rarely share one, each route is its
own matrix-vector product on the CUDA cores, and the layer takes two launches instead of four.

- GEMV 1 (`moe_gemv_first_kernel`): one program per (route, N tile) finds its expert from topk_ids
  itself (no route grouping), multiplies the token's row by the expert's gate and up rows, adds
  b13, applies the activation and writes the route's row of h.
- GEMV 2 + top-k sum (`moe_gemv_second_kernel`): one program per (token, N tile) adds, for each
  of the token's routes in slot order, topk_weight * (W2[e] @ h[route] + b2[e]) in fp32: the
  top-k sum happens in registers, deterministic, and nothing is written per route.

Memory latency, not bandwidth, bounds a GEMV whose loads wait one K step at a time: GEMV 1 issues
the next step's loads before the current step's multiply-adds, GEMV 2 issues one K step of all
its routes together.

Tensor cores would spend most of a 16-row tile on padding here; instead every weight element is
converted to fp32 once and met by one fused multiply-add. Weight tiles are [BLOCK_N, BLOCK_K]
read as [BLOCK_N, K blocks, K inner]: the inner extent is one fp8 128 x 128 scale block (bf16
uses the same shape), or one 32-value mxfp4 group (16 bytes), so scales are loaded once per
block or group and broadcast. mxfp4 values are built exactly from their bits: the e2m1 nibble
placed in an fp16 (sign, exponent and mantissa fields line up; e = 0 with m = 1 becomes the fp16
subnormal 2^-15) is the value times 2^-14, so the activations are scaled by 2^14 once, and the
e8m0 scale becomes the fp32 2^(e - 127) from its bits."""

from __future__ import annotations

import triton
import triton.language as tl

from backends.triton_moe.routing import local_expert

E2M1_IN_FP16 = tl.constexpr(16384.0)  # 2^14: an e2m1 nibble read as fp16 is its value over this


@triton.jit
def _e2m1_times_2_pow_minus_14(nibble):
    """An e2m1 nibble (int32) as fp32, exact, over 2^14: its sign, exponent and mantissa bits moved
    to fp16's places, then widened."""
    bits = ((nibble & 7) << 9) | ((nibble & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _gemv_load(x_row_ptr, live, w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
               scale_cols, FORMAT: tl.constexpr, BLOCK_K: tl.constexpr):
    """The raw operands of the K step at k0: (x_a, x_b, w, s). mxfp4: the even-k and odd-k
    activations [groups, 16], the packed bytes [BN, groups, 16] and e8m0 scales [BN, groups];
    otherwise x [blocks, 128] (twice), the weight [BN, blocks, 128] and, for fp8, its block scales
    [BN, blocks]. Nothing is read where `live` is false or past K."""
    if FORMAT == 2:
        groups: tl.constexpr = BLOCK_K // 32
        g = k0 // 32 + tl.arange(0, groups)
        byte = g[:, None] * 16 + tl.arange(0, 16)[None, :]  # [groups, 16] byte index along the row
        g_ok = g < tl.where(live, K // 32, 0)
        x_a = tl.load(x_row_ptr + 2 * byte, mask=g_ok[:, None], other=0.0)
        x_b = tl.load(x_row_ptr + 2 * byte + 1, mask=g_ok[:, None], other=0.0)
        w = tl.load(w_ptr + expert * stride_we + rows[:, None, None].to(tl.int64) * (K // 2)
                    + byte[None, :, :], mask=row_ok[:, None, None] & g_ok[None, :, None], other=0)
        s = tl.load(s_ptr + expert * stride_se + rows[:, None].to(tl.int64) * (K // 32) + g[None, :],
                    mask=row_ok[:, None] & g_ok[None, :], other=0)
    else:
        blocks: tl.constexpr = BLOCK_K // 128
        b = k0 // 128 + tl.arange(0, blocks)
        k = b[:, None] * 128 + tl.arange(0, 128)[None, :]  # [blocks, 128]
        k_ok = k < tl.where(live, K, 0)
        x_a = tl.load(x_row_ptr + k, mask=k_ok, other=0.0)
        x_b = x_a
        w = tl.load(w_ptr + expert * stride_we + rows[:, None, None].to(tl.int64) * K + k[None, :, :],
                    mask=row_ok[:, None, None] & k_ok[None, :, :], other=0.0)
        if FORMAT == 1:
            s = tl.load(s_ptr + expert * stride_se + (rows // 128)[:, None] * scale_cols + b[None, :],
                        mask=row_ok[:, None] & (b < tl.where(live, scale_cols, 0))[None, :], other=0.0)
        else:
            s = tl.zeros([1, 1], dtype=tl.float32)
    return x_a, x_b, w, s


@triton.jit
def _gemv_fma(acc, x_a, x_b, w, s, x_mul, FORMAT: tl.constexpr):
    """acc[n, b, i] += W[n, k] * x[k] * x_mul over the operands _gemv_load returned."""
    if FORMAT == 2:
        x_even = x_a.to(tl.float32) * (x_mul * E2M1_IN_FP16)
        x_odd = x_b.to(tl.float32) * (x_mul * E2M1_IN_FP16)
        packed = w.to(tl.int32)
        scale = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)[:, :, None]
        w_even = _e2m1_times_2_pow_minus_14(packed & 0xF)
        w_odd = _e2m1_times_2_pow_minus_14((packed >> 4) & 0xF)
        acc += (w_even * x_even[None, :, :] + w_odd * x_odd[None, :, :]) * scale
    else:
        wf = w.to(tl.float32)
        if FORMAT == 1:
            wf = wf * s[:, :, None]
        acc += wf * (x_a.to(tl.float32) * x_mul)[None, :, :]
    return acc


@triton.jit
def _zeros(FORMAT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    if FORMAT == 2:
        acc = tl.zeros([BLOCK_N, BLOCK_K // 32, 16], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_K // 128, 128], dtype=tl.float32)
    return acc


@triton.jit
def moe_gemv_first_kernel(
    x_ptr, topk_ids_ptr, expert_map_ptr, w_ptr, s_ptr, bias_ptr, h_ptr,
    num_routes, num_experts, N, K, N_TOTAL, stride_we, stride_se, scale_cols, gate_stride, up_offset,
    swiglu_alpha, swiglu_limit,
    TOP_K: tl.constexpr, LOCAL_EXPERTS: tl.constexpr, HAS_MAP: tl.constexpr, FORMAT: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """h[route, n] = act(W13[e] x[token] + b13[e]) for the N tile of one route; a dropped route
    writes nothing (GEMV 2 skips it too)."""
    route = tl.program_id(0)
    expert = local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts, LOCAL_EXPERTS,
                          HAS_MAP)
    if expert < 0:
        return
    expert = expert.to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    gate_rows = offs_n * gate_stride
    up_rows = gate_rows + up_offset
    GATED: tl.constexpr = ACTIVATION != 2
    x_row = x_ptr + (route // TOP_K).to(tl.int64) * K
    live = route < num_routes  # a tensor, as _gemv_load's masks need
    if GATED:
        up_ok = n_ok
    else:
        up_ok = offs_n < 0  # no up rows: nothing read
    acc = _zeros(FORMAT, BLOCK_N, BLOCK_K)
    acc_up = _zeros(FORMAT, BLOCK_N, BLOCK_K)
    # Each step's loads are issued before the previous step's multiply-adds (the loop's loads do
    # not feed a dot, so Triton's pipeliner leaves them to the program): two steps in flight.
    x_a, x_b, w, s = _gemv_load(x_row, live, w_ptr, s_ptr, expert, gate_rows, n_ok, 0, K, stride_we,
                                stride_se, scale_cols, FORMAT, BLOCK_K)
    _, _, w_up, s_up = _gemv_load(x_row, live, w_ptr, s_ptr, expert, up_rows, up_ok, 0, K, stride_we,
                                  stride_se, scale_cols, FORMAT, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        nx_a, nx_b, nw, ns = _gemv_load(x_row, live, w_ptr, s_ptr, expert, gate_rows, n_ok, k0 + BLOCK_K, K,
                                        stride_we, stride_se, scale_cols, FORMAT, BLOCK_K)
        _, _, nw_up, ns_up = _gemv_load(x_row, live, w_ptr, s_ptr, expert, up_rows, up_ok, k0 + BLOCK_K, K,
                                        stride_we, stride_se, scale_cols, FORMAT, BLOCK_K)
        acc = _gemv_fma(acc, x_a, x_b, w, s, 1.0, FORMAT)
        acc_up = _gemv_fma(acc_up, x_a, x_b, w_up, s_up, 1.0, FORMAT)
        x_a, x_b, w, s, w_up, s_up = nx_a, nx_b, nw, ns, nw_up, ns_up
    gate = tl.sum(tl.sum(acc, axis=2), axis=1)
    up = tl.sum(tl.sum(acc_up, axis=2), axis=1)
    if HAS_BIAS:
        gate += tl.load(bias_ptr + expert * N_TOTAL + gate_rows, mask=n_ok, other=0.0)
        if GATED:
            up += tl.load(bias_ptr + expert * N_TOTAL + up_rows, mask=n_ok, other=0.0)
    if ACTIVATION == 0:
        h = gate * tl.sigmoid(gate) * up
    elif ACTIVATION == 1:
        g = tl.minimum(gate, swiglu_limit)
        u = tl.clamp(up, -swiglu_limit, swiglu_limit)
        h = g * tl.sigmoid(swiglu_alpha * g) * (u + 1.0)
    else:
        h = tl.maximum(gate, 0.0)
        h = h * h
    tl.store(h_ptr + route.to(tl.int64) * N + offs_n, h.to(h_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def moe_gemv_second_kernel(
    h_ptr, topk_ids_ptr, expert_map_ptr, topk_weights_ptr, w_ptr, s_ptr, bias_ptr, out_ptr,
    num_routes, num_experts, N, K, stride_we, stride_se, scale_cols,
    TOP_K: tl.constexpr, LOCAL_EXPERTS: tl.constexpr, HAS_MAP: tl.constexpr, FORMAT: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[token, n] = sum over the token's live routes, in slot order, of
    topk_weight * (W2[e] h[route] + b2[e]), in fp32; zeros when every route is dropped."""
    token = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    acc = _zeros(FORMAT, BLOCK_N, BLOCK_K)
    bias = tl.zeros([BLOCK_N], dtype=tl.float32)
    # K steps outside, the routes (unrolled, no branches: a dropped route's loads are masked off)
    # inside, so the loads of all of a token's routes are in flight together.
    for k0 in range(0, K, BLOCK_K):
        for slot in tl.static_range(TOP_K):
            route = token * TOP_K + slot
            expert = local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts,
                                  LOCAL_EXPERTS, HAS_MAP)
            live = expert >= 0
            e = tl.where(live, expert, 0).to(tl.int64)
            weight = tl.load(topk_weights_ptr + route, mask=live, other=0.0).to(tl.float32)
            x_a, x_b, w, s = _gemv_load(h_ptr + route.to(tl.int64) * K, live, w_ptr, s_ptr, e, offs_n,
                                        n_ok, k0, K, stride_we, stride_se, scale_cols, FORMAT,
                                        BLOCK_K)
            acc = _gemv_fma(acc, x_a, x_b, w, s, weight, FORMAT)
    if HAS_BIAS:
        for slot in tl.static_range(TOP_K):
            route = token * TOP_K + slot
            expert = local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts,
                                  LOCAL_EXPERTS, HAS_MAP)
            live = expert >= 0
            weight = tl.load(topk_weights_ptr + route, mask=live, other=0.0).to(tl.float32)
            bias += weight * tl.load(bias_ptr + tl.where(live, expert, 0).to(tl.int64) * N + offs_n,
                                     mask=offs_n < tl.where(live, N, 0), other=0.0)
    y = tl.sum(tl.sum(acc, axis=2), axis=1) + bias
    tl.store(out_ptr + token.to(tl.int64) * N + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_ok)
