"""backends/reference against a float64 evaluation written here from docs/contract.md alone, decoding
every format bit by bit rather than through the reference's own dequantizers."""

import math

import attrs
import pytest
import torch
from hal.backends.reference import ops

import hal
from hal.synth import random_expert_map, random_masked_inputs, random_routing, random_tokens, random_weights
from hal.testing import is_poison, poison

pytestmark = pytest.mark.cpu


def decode_e4m3fn(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exp, mant = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0xF and mant == 0x7:
        return math.nan
    if exp == 0:
        return sign * (mant / 8) * 2.0 ** -6
    return sign * (1 + mant / 8) * 2.0 ** (exp - 7)


def decode_e2m1(nibble: int) -> float:
    sign = -1.0 if nibble & 0x8 else 1.0
    exp, mant = (nibble >> 1) & 0x3, nibble & 0x1
    return sign * (mant * 0.5 if exp == 0 else (1 + mant / 2) * 2.0 ** (exp - 1))


FP8_TABLE = torch.tensor([decode_e4m3fn(b) for b in range(256)], dtype=torch.float64)
E2M1_TABLE = torch.tensor([decode_e2m1(n) for n in range(16)], dtype=torch.float64)


def expert_weight(spec, q, scale, e):
    """[out, in] float64 for expert e, decoded independently."""
    fmt = spec.weight_format
    if fmt == "bf16":
        return q[e].double()
    if fmt == "fp8_block128":
        w = FP8_TABLE[q[e].view(torch.uint8).long()]
        rows, cols = w.shape
        s = scale[e].double()
        idx_r = torch.arange(rows) // 128
        idx_c = torch.arange(cols) // 128
        return w * s[idx_r][:, idx_c]
    if fmt == "mxfp4":
        packed = q[e].long()
        vals = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.float64)
        vals[:, 0::2] = E2M1_TABLE[packed % 16]
        vals[:, 1::2] = E2M1_TABLE[packed // 16]
        exps = scale[e].long() - 127
        return vals * (2.0 ** exps.double()).repeat_interleave(32, dim=1)
    # uint4b8: int32 [K/8, N], nibble i of word r is k = 8r + i
    words = q[e].long() & 0xFFFFFFFF
    k8, n = words.shape
    w = torch.empty(k8 * 8, n, dtype=torch.float64)
    for i in range(8):
        w[i::8] = ((words // (16 ** i)) % 16).double() - 8
    s = scale[e].double()
    group = (k8 * 8) // s.shape[0]
    return (w * s.repeat_interleave(group, dim=0)).T


def act(spec, h):
    I = spec.intermediate_size
    if spec.activation == "silu":
        g, u = h[:I], h[I:]
        return g / (1 + torch.exp(-g)) * u
    if spec.activation == "swiglu_oai":
        g = torch.minimum(h[0::2], torch.tensor(spec.swiglu_limit, dtype=h.dtype))
        u = h[1::2].clamp(-spec.swiglu_limit, spec.swiglu_limit)
        return g / (1 + torch.exp(-spec.swiglu_alpha * g)) * (u + 1)
    return torch.clamp(h, min=0) ** 2


def independent_moe(spec, x, tw, ti, w):
    out = torch.zeros(x.shape, dtype=torch.float64)
    for m in range(x.shape[0]):
        for j in range(spec.top_k):
            e = int(ti[m, j])
            if w.expert_map is not None:
                e = int(w.expert_map[e])
                if e < 0:
                    continue
            h = expert_weight(spec, w.w13, w.w13_scale, e) @ x[m].double()
            if w.b13 is not None:
                h = h + w.b13[e].double()
            y = expert_weight(spec, w.w2, w.w2_scale, e) @ act(spec, h)
            if w.b2 is not None:
                y = y + w.b2[e].double()
            out[m] += float(tw[m, j]) * y
    return out


CASES = [
    ("bf16", "silu", False, None, 256, 128),
    ("fp8_block128", "silu", False, None, 320, 160),  # ragged 128-blocks on both dims
    ("fp8_block128", "relu2", False, 5, 256, 96),
    ("mxfp4", "swiglu_oai", True, None, 288, 160),
    ("mxfp4", "silu", True, 6, 256, 64),
    ("int4_g128", "silu", False, None, 256, 128),
    ("int4_g128", "swiglu_oai", True, 4, 384, 256),
]


@pytest.mark.parametrize("fmt, activation, bias, local, H, I", CASES)
@pytest.mark.parametrize("routing", ["uniform", "one_expert"])
def test_reference_matches_independent_float64(fmt, activation, bias, local, H, I, routing):
    spec = hal.MoESpec(num_experts=8, top_k=3, hidden_size=H, intermediate_size=I,
                       weight_format=fmt, activation=activation, has_bias=bias, num_local_experts=local)
    w = random_weights(spec, seed=11)
    if spec.is_ep:
        w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=3))
    x = random_tokens(spec, 7, seed=5)
    tw, ti = random_routing(spec, 7, routing, seed=9)
    want = independent_moe(spec, x, tw, ti, w)
    got = ops.moe_tokens(spec, x, tw, ti, w, compute_dtype=torch.float64)
    assert got.dtype == x.dtype
    rel = (got.double() - want).norm() / want.norm()
    assert want.norm() > 0 and rel < 1e-2, rel
    # and in float64 before the bf16 rounding of the output
    exact = ops.moe_tokens(spec, x.double(), tw, ti, w, compute_dtype=torch.float64)
    assert torch.allclose(exact, want, rtol=1e-9, atol=1e-9)


def test_fp8_subnormals_and_zero_decode_exactly():
    every_byte = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = ~torch.isnan(FP8_TABLE)
    assert torch.equal(every_byte.double()[finite], FP8_TABLE[finite])


def test_requant_reference_contract():
    E, H, max_m = 3, 256, 5
    masked = [0, 5, 2]
    x, scale, masked_m = random_masked_inputs(E, H, max_m, masked, seed=1, scale_layout="column")
    out = poison(torch.empty_like(x))
    s_out = torch.tensor([0.01])
    ops.requant_fp8(x, scale, masked_m, s_out, out)
    assert bool(is_poison(out[0]).all()) and bool(is_poison(out[2, 2:]).all())
    for e, m in enumerate(masked):
        for r in range(m):
            v = x[e, r].float() * scale[e, r].repeat_interleave(128) * (1.0 / torch.tensor(0.01))
            want = v.clamp(-448, 448).to(torch.float8_e4m3fn)
            assert torch.equal(out[e, r].view(torch.uint8), want.view(torch.uint8))
    assert float(out[1].float().abs().max()) == 448.0  # large inputs saturate, never NaN
