"""Exact dequantization of every checkpoint weight format to a float tensor in the math layout:
w13 -> [E, rows, H] and w2 -> [E, H, I] (output features x input features)."""

from __future__ import annotations

import torch

from hal.spec import FP8_BLOCK, INT4_PACK, MXFP4_GROUP, MoESpec

# OCP MX e2m1 magnitudes indexed by the low three bits; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
UINT4B8_ZERO = 8  # GPTQ symmetric: stored nibble 8 means zero


def fp8_block(q: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """e4m3fn values times one scale per 128x128 block; the cast from float8 is exact, zero and
    subnormals included. Ragged last blocks take their block's scale."""
    rows, cols = q.shape[-2:]
    s = scale.to(dtype).repeat_interleave(FP8_BLOCK, dim=-2)[..., :rows, :]
    s = s.repeat_interleave(FP8_BLOCK, dim=-1)[..., :cols]
    return q.to(dtype) * s


def e2m1(packed: torch.Tensor, dtype) -> torch.Tensor:
    """uint8 [..., K/2] with the even k in the low nibble -> [..., K]."""
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=dtype,
                         device=packed.device)
    lo = (packed & 0xF).long()
    hi = (packed >> 4).long()
    return torch.stack((table[lo], table[hi]), dim=-1).flatten(-2)


def mxfp4(packed: torch.Tensor, scale: torch.Tensor, dtype) -> torch.Tensor:
    """e2m1 values times 2^(s - 127) per 32 along K; ldexp keeps the power of two exact."""
    values = e2m1(packed, dtype)
    exponent = scale.to(torch.int32) - 127
    factor = torch.ldexp(torch.ones(exponent.shape, dtype=dtype, device=scale.device), exponent)
    return values * factor.repeat_interleave(MXFP4_GROUP, dim=-1)


def uint4b8(qweight: torch.Tensor, scales: torch.Tensor, dtype) -> torch.Tensor:
    """GPTQ int32 [..., K/8, N] (eight nibbles along K, lowest first) with scales [..., G, N]
    -> [..., N, K]."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)
    nibbles = (qweight.unsqueeze(-2) >> shifts.view(-1, 1)) & 0xF  # [..., K/8, 8, N]
    k = qweight.shape[-2] * INT4_PACK
    q = nibbles.flatten(-3, -2).to(dtype) - UINT4B8_ZERO  # [..., K, N]
    group = k // scales.shape[-2]
    w = q * scales.to(dtype).repeat_interleave(group, dim=-2)
    return w.transpose(-1, -2)


def _dequant(spec: MoESpec, q, scale, dtype, expert):
    q = q if expert is None else q[expert]
    scale = scale if (scale is None or expert is None) else scale[expert]
    fmt = spec.weight_format
    if fmt == "bf16":
        return q.to(dtype)
    if fmt == "fp8_block128":
        return fp8_block(q, scale, dtype)
    if fmt == "mxfp4":
        return mxfp4(q, scale, dtype)
    return uint4b8(q, scale, dtype)


def w13(spec: MoESpec, weights, dtype=torch.float32, expert=None) -> torch.Tensor:
    """[E, rows, H], or [rows, H] for one expert."""
    return _dequant(spec, weights.w13, weights.w13_scale, dtype, expert)


def w2(spec: MoESpec, weights, dtype=torch.float32, expert=None) -> torch.Tensor:
    """[E, H, I], or [H, I] for one expert."""
    return _dequant(spec, weights.w2, weights.w2_scale, dtype, expert)
