"""The decode path: when a call has so few routes that experts rarely share one, each route is its
own matrix-vector product on the CUDA cores, and the layer takes two launches instead of four.

- GEMV 1 (`moe_gemv_first_kernel`): one program per (route, N tile) finds its expert from topk_ids
  itself (no route grouping), multiplies the token's row by the expert's gate and up rows, adds
  b13, applies the activation and writes the route's row of h.
- GEMV 2 + top-k sum (`moe_gemv_second_kernel`): one program per (token, N tile) loops over the
  token's routes in slot order, adding topk_weight * (W2[e] @ h[route] + b2[e]) in fp32: the
  top-k sum happens in registers, deterministic, and nothing is written per route.

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
from hal.backends.triton_moe.routing import local_expert

E2M1_IN_FP16 = tl.constexpr(16384.0)  # 2^14: an e2m1 nibble read as fp16 is its value over this


@triton.jit
def _e2m1_times_2_pow_minus_14(nibble):
    """An e2m1 nibble (int32) as fp32, exact, over 2^14: its sign, exponent and mantissa bits moved
    to fp16's places, then widened."""
    bits = ((nibble & 7) << 9) | ((nibble & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _gemv_step(acc, x_row_ptr, x_mul, w_ptr, s_ptr, expert, rows, row_ok, k0, K, stride_we, stride_se,
               scale_cols, FORMAT: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[n, b, i] += W[rows[n], k] * x[k] * x_mul for the K step at k0 (acc: [BN, blocks, inner]
    as the module docstring describes)."""
    if FORMAT == 2:
        groups: tl.constexpr = BLOCK_K // 32
        g = k0 // 32 + tl.arange(0, groups)
        j = tl.arange(0, 16)
        byte = g[:, None] * 16 + j[None, :]  # [groups, 16] byte index along the packed row
        g_ok = g < K // 32
        x_even = tl.load(x_row_ptr + 2 * byte, mask=g_ok[:, None], other=0.0).to(tl.float32)
        x_odd = tl.load(x_row_ptr + 2 * byte + 1, mask=g_ok[:, None], other=0.0).to(tl.float32)
        x_even = x_even * (x_mul * E2M1_IN_FP16)
        x_odd = x_odd * (x_mul * E2M1_IN_FP16)
        w_ok = row_ok[:, None, None] & g_ok[None, :, None]
        packed = tl.load(w_ptr + expert * stride_we + rows[:, None, None].to(tl.int64) * (K // 2)
                         + byte[None, :, :], mask=w_ok, other=0).to(tl.int32)
        e8m0 = tl.load(s_ptr + expert * stride_se + rows[:, None].to(tl.int64) * (K // 32) + g[None, :],
                       mask=row_ok[:, None] & g_ok[None, :], other=0).to(tl.int32)
        scale = (e8m0 << 23).to(tl.float32, bitcast=True)[:, :, None]
        lo = packed & 0xF
        hi = (packed >> 4) & 0xF
        w_even = _e2m1_times_2_pow_minus_14(lo)
        w_odd = _e2m1_times_2_pow_minus_14(hi)
        acc += (w_even * x_even[None, :, :] + w_odd * x_odd[None, :, :]) * scale
    else:
        blocks: tl.constexpr = BLOCK_K // 128
        b = k0 // 128 + tl.arange(0, blocks)
        k = b[:, None] * 128 + tl.arange(0, 128)[None, :]  # [blocks, 128]
        k_ok = k < K
        x = tl.load(x_row_ptr + k, mask=k_ok, other=0.0).to(tl.float32) * x_mul
        w = tl.load(w_ptr + expert * stride_we + rows[:, None, None].to(tl.int64) * K + k[None, :, :],
                    mask=row_ok[:, None, None] & k_ok[None, :, :], other=0.0).to(tl.float32)
        if FORMAT == 1:
            s = tl.load(s_ptr + expert * stride_se + (rows // 128)[:, None] * scale_cols + b[None, :],
                        mask=row_ok[:, None] & (b < scale_cols)[None, :], other=0.0)
            w = w * s[:, :, None]
        acc += w * x[None, :, :]
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
    acc = _zeros(FORMAT, BLOCK_N, BLOCK_K)
    acc_up = _zeros(FORMAT, BLOCK_N, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        acc = _gemv_step(acc, x_row, 1.0, w_ptr, s_ptr, expert, gate_rows, n_ok, k0, K, stride_we,
                         stride_se, scale_cols, FORMAT, BLOCK_K)
        if GATED:
            acc_up = _gemv_step(acc_up, x_row, 1.0, w_ptr, s_ptr, expert, up_rows, n_ok, k0, K, stride_we,
                                stride_se, scale_cols, FORMAT, BLOCK_K)
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
    for slot in tl.static_range(TOP_K):
        route = token * TOP_K + slot
        expert = local_expert(topk_ids_ptr, expert_map_ptr, route, num_routes, num_experts,
                              LOCAL_EXPERTS, HAS_MAP)
        if expert >= 0:
            e = expert.to(tl.int64)
            weight = tl.load(topk_weights_ptr + route).to(tl.float32)
            h_row = h_ptr + route.to(tl.int64) * K
            for k0 in range(0, K, BLOCK_K):
                acc = _gemv_step(acc, h_row, weight, w_ptr, s_ptr, e, offs_n, n_ok, k0, K, stride_we,
                                 stride_se, scale_cols, FORMAT, BLOCK_K)
            if HAS_BIAS:
                bias += weight * tl.load(bias_ptr + e * N + offs_n, mask=n_ok, other=0.0)
    y = tl.sum(tl.sum(acc, axis=2), axis=1) + bias
    tl.store(out_ptr + token.to(tl.int64) * N + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_ok)
