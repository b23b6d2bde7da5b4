"""Triton grouped GEMMs of the W4AFP8 masked MoE: int4 (uint4b8, group 128) weights x FP8
activations on the DeepEP layout [E, max_m, K], one grid over (m-programs, n-blocks, experts).

Per K group of 128 the int4 values are unpacked in registers to q - 8 in [-8, 7], which e4m3fn
and e4m3fnuz hold exactly, so the MMA runs in FP8 with fp32 accumulation; the group's partial sum
is then scaled by its bf16 weight scale s[group, n] and added to the accumulator. The MMA input
dtype is a constexpr (DOT_DTYPE): the activation's FP8 on a GPU, fp32 in Triton's CPU
interpreter, whose FP8 dot is not a hardware MMA; the operands hold the same values either way.

GEMM 1 reads per-tensor FP8 (feed "requant") or DeepEP's per-token-group FP8 (feed "fused"), which
it requantizes in registers with the contract's arithmetic, fp8(clamp((x * s_group) * (1 / s13))),
before the MMA. Its epilogue applies the activation and writes per-tensor FP8 for GEMM 2 with
1 / s2. GEMM 2 writes bf16. Rows at or beyond masked_m[e] are never read or written.

Only tl APIs present in both Triton 3.6 and 3.9 are used."""

from __future__ import annotations

import triton
import triton.language as tl

# ACTIVATION constexpr codes, in hal.spec.ACTIVATIONS' words.
ACTIVATION_CODES = {"silu": 0, "swiglu_oai": 1, "relu2": 2}


@triton.jit
def _requant(values, inv_scale, fp8_max, fp8_dtype: tl.constexpr):
    """fp8(clamp(values * inv_scale, +-max)): the contract's rounding point, as hal.backends.requant and
    hal.backends.reference.ops.quantize_fp8 compute it."""
    y = tl.clamp(values * inv_scale, -fp8_max, fp8_max, propagate_nan=tl.PropagateNan.ALL)
    return y.to(fp8_dtype)


@triton.jit
def _activation_tile(a_ptr, a_scale_ptr, expert, offs_m, live_m, k0, max_m, K,
                     scale_stride_e, scale_stride_m, scale_stride_g, inv_in_scale, fp8_max,
                     GROUP_K: tl.constexpr, GROUP_SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """[BLOCK_M, GROUP_K] of the FP8 activation, as per-tensor FP8 values in DOT_DTYPE. Dead rows
    load as 0 and are never stored."""
    offs_k = k0 + tl.arange(0, GROUP_K)
    rows = expert.to(tl.int64) * max_m + offs_m  # int64: E x max_m x K passes 2**31
    a = tl.load(a_ptr + rows[:, None] * K + offs_k[None, :], mask=live_m[:, None], other=0.0)
    if GROUP_SCALED:
        scale_row = expert.to(tl.int64) * scale_stride_e + offs_m.to(tl.int64) * scale_stride_m
        scale = tl.load(a_scale_ptr + scale_row + (k0 // GROUP_K) * scale_stride_g, mask=live_m,
                        other=0.0)
        a = _requant(a.to(tl.float32) * scale[:, None], inv_in_scale, fp8_max, a_ptr.dtype.element_ty)
    return a.to(DOT_DTYPE)


@triton.jit
def _scaled_group_dot(a, acc, q_ptr, s_ptr, q_base, s_base, offs_n, live_n, k0, N,
                      GROUP_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """acc + (a @ W[k0:k0 + GROUP_K, offs_n]) * s[k0 / GROUP_K, offs_n]: one scale group.

    q is the prepared uint4b8 weight, int32 [K / GROUP_K, N, GROUP_K / 8] per expert (blocked by
    K group: a group's [N, GROUP_K] tile is one contiguous run, eight nibbles per word along K,
    lowest first); s is bf16 [K / GROUP_K, N] per expert."""
    words = tl.arange(0, GROUP_K // 8)
    column = ((k0 // GROUP_K) * N + offs_n).to(tl.int64) * (GROUP_K // 8)
    packed = tl.load(q_ptr + q_base + column[None, :] + words[:, None],
                     mask=live_n[None, :], other=0)  # [GROUP_K / 8, BLOCK_N], each word loaded once
    shifts = tl.arange(0, 8) * 4
    nibbles = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [GROUP_K / 8, 8, BLOCK_N]
    # Row-major [word, nibble] -> k = 8 word + nibble: lowest nibble first, as GPTQ packs.
    nibbles = tl.reshape(nibbles, (GROUP_K, nibbles.shape[2]))
    w = (nibbles - 8).to(tl.float32).to(DOT_DTYPE)  # [-8, 7]: exact in e4m3fn and e4m3fnuz
    scale = tl.load(s_ptr + s_base + (k0 // GROUP_K) * N + offs_n, mask=live_n, other=0.0)
    return acc + tl.dot(a, w) * scale.to(tl.float32)[None, :]


@triton.jit
def _activation(gate, up, swiglu_alpha, swiglu_limit, ACTIVATION: tl.constexpr):
    """hal.spec activations in fp32 (hal.backends.reference.activation)."""
    # One return after static branches: Triton resolves constexpr ifs at compile time.
    if ACTIVATION == 0:  # silu(gate) * up
        act = gate / (1.0 + tl.exp(-gate)) * up
    elif ACTIVATION == 1:  # swiglu_oai
        g = tl.minimum(gate, swiglu_limit)
        u = tl.clamp(up, -swiglu_limit, swiglu_limit)
        act = g / (1.0 + tl.exp(-swiglu_alpha * g)) * (u + 1.0)
    else:  # relu2
        r = tl.maximum(gate, 0.0)
        act = r * r
    return act


@triton.jit
def w4a8_gemm1_kernel(x_ptr, x_scale_ptr, masked_m_ptr, q_ptr, s_ptr, in_scale_ptr, out_scale_ptr,
                      h_ptr, max_m, hidden, inter, weight_rows, scale_stride_e, scale_stride_m,
                      scale_stride_g, fp8_max, swiglu_alpha, swiglu_limit,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_K: tl.constexpr,
                      ACTIVATION: tl.constexpr, GROUP_SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """h[e, r, n] = fp8(clamp(act(x[e, r] @ W13_e)[n] * (1 / s2))) for r < masked_m[e], n < inter.

    grid = (m-programs, inter / BLOCK_N, experts). Gated activations read the gate columns
    [0, inter) and the up columns [inter, 2 inter) of the prepared weight (swiglu_oai's interleaved
    rows are split that way in prepare) into two accumulators that share the activation tile;
    weight_rows is 2 inter for them and inter for relu2."""
    m_program = tl.program_id(0)
    n_block = tl.program_id(1)
    expert = tl.program_id(2)
    # min(): with check=False a masked_m above max_m must still not leave the expert's rows.
    rows = tl.minimum(tl.load(masked_m_ptr + expert), max_m)
    in_scale = tl.load(in_scale_ptr).to(tl.float32)
    inv_in_scale = tl.math.div_rn(1.0, in_scale)
    inv_out_scale = tl.math.div_rn(1.0, tl.load(out_scale_ptr).to(tl.float32))
    q_base = expert.to(tl.int64) * weight_rows * (hidden // 8)
    s_base = expert.to(tl.int64) * (hidden // GROUP_K) * weight_rows
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    live_n = offs_n < inter
    for m_block in tl.range(m_program, (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(0)):
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        live_m = offs_m < rows
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, hidden, GROUP_K):
            a = _activation_tile(x_ptr, x_scale_ptr, expert, offs_m, live_m, k0, max_m, hidden,
                                 scale_stride_e, scale_stride_m, scale_stride_g, inv_in_scale, fp8_max,
                                 GROUP_K, GROUP_SCALED, DOT_DTYPE)
            gate = _scaled_group_dot(a, gate, q_ptr, s_ptr, q_base, s_base, offs_n, live_n, k0,
                                     weight_rows, GROUP_K, DOT_DTYPE)
            if ACTIVATION != 2:  # gated
                up = _scaled_group_dot(a, up, q_ptr, s_ptr, q_base, s_base, offs_n + inter, live_n,
                                       k0, weight_rows, GROUP_K, DOT_DTYPE)
        act = _activation(gate * in_scale, up * in_scale, swiglu_alpha, swiglu_limit, ACTIVATION)
        h = _requant(act, inv_out_scale, fp8_max, h_ptr.dtype.element_ty)
        out_rows = expert.to(tl.int64) * max_m + offs_m
        tl.store(h_ptr + out_rows[:, None] * inter + offs_n[None, :], h,
                 mask=live_m[:, None] & live_n[None, :])


@triton.jit
def w4a8_gemm2_kernel(h_ptr, masked_m_ptr, q_ptr, s_ptr, in_scale_ptr, out_ptr, max_m, inter, hidden,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_K: tl.constexpr,
                      DOT_DTYPE: tl.constexpr):
    """out[e, r, n] = bf16((h[e, r] @ W2_e)[n] * s2) for r < masked_m[e]: h is per-tensor FP8.
    grid = (m-programs, hidden / BLOCK_N, experts)."""
    m_program = tl.program_id(0)
    n_block = tl.program_id(1)
    expert = tl.program_id(2)
    rows = tl.minimum(tl.load(masked_m_ptr + expert), max_m)
    in_scale = tl.load(in_scale_ptr).to(tl.float32)
    q_base = expert.to(tl.int64) * hidden * (inter // 8)
    s_base = expert.to(tl.int64) * (inter // GROUP_K) * hidden
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    live_n = offs_n < hidden
    for m_block in tl.range(m_program, (rows + BLOCK_M - 1) // BLOCK_M, tl.num_programs(0)):
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        live_m = offs_m < rows
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, inter, GROUP_K):
            a = _activation_tile(h_ptr, h_ptr, expert, offs_m, live_m, k0, max_m, inter, 0, 0, 0,
                                 1.0, 0.0, GROUP_K, False, DOT_DTYPE)
            acc = _scaled_group_dot(a, acc, q_ptr, s_ptr, q_base, s_base, offs_n, live_n, k0, hidden,
                                    GROUP_K, DOT_DTYPE)
        out_rows = expert.to(tl.int64) * max_m + offs_m
        tl.store(out_ptr + out_rows[:, None] * hidden + offs_n[None, :], (acc * in_scale).to(tl.bfloat16),
                 mask=live_m[:, None] & live_n[None, :])


def grid(m_programs: int, n: int, block_n: int, experts: int) -> tuple:
    return (m_programs, triton.cdiv(n, block_n), experts)
