"""cpu_brgemm's fp8 e4m3 decoders against torch's float8_e4m3fn -> float conversion, bit for bit
over all 256 bytes (NaN included), on every decoder of each ISA build this CPU runs; and NaN
weights reaching the output as the reference's NaN, on every GEMM path."""

from __future__ import annotations

import pytest
import torch
from cpu_brgemm_helpers import isa_params, machine_target, make_kernel, weights_for
from hal.backends.cpu_brgemm import extension
from hal.backends.reference import ops as reference

from hal import synth
from hal.spec import MoESpec
from hal.testing import ACCURACY, rel_err

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("dequantize", [False, True], ids=["in_registers", "panel"])
def test_every_byte_decodes_as_torch(isa, dequantize):
    """`in_registers` is TinyGEMM's decoder, `panel` the dequantization of a whole panel (BRGEMM's
    B, on AMX too, and TinyGEMM blocks of more than one tile). Each byte sits once in an ascending
    and once in a descending run, so it passes through two different lanes."""
    make_kernel(MoESpec(num_experts=1, top_k=1, hidden_size=32, intermediate_size=32,
                        weight_format="fp8_block128"), machine_target(), isa)  # skips an ISA this CPU lacks
    every = torch.arange(256, dtype=torch.uint8)
    packed = torch.cat([every, every.flip(0)])
    got = extension.ops(isa).decode_fp8(packed, dequantize)
    want = packed.view(torch.float8_e4m3fn).float()
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), [
        (hex(int(b)), float(g), float(w)) for b, g, w in zip(packed, got, want, strict=True)
        if g.view(torch.int32) != w.view(torch.int32)][:8]


@pytest.mark.parametrize("isa", isa_params())
def test_nan_weights_give_the_reference_nan_rows(isa):
    """A corrupt checkpoint's NaN bytes (0x7f in w13 of expert 1, 0xff in w2 of expert 4) make the
    rows routed to those experts NaN, as the reference's; the other rows stay finite and accurate.
    Expert 1 takes 37 routes (a full 32-row block and a 5-row one), expert 4 takes 3."""
    spec = MoESpec(num_experts=6, top_k=2, hidden_size=64, intermediate_size=96,
                   weight_format="fp8_block128", has_bias=True)
    weights = weights_for(spec, seed=41)
    w13 = weights.w13.view(torch.uint8).clone()
    w2 = weights.w2.view(torch.uint8).clone()
    w13[1, 17, 5] = 0x7F
    w2[4, 60, 90] = 0xFF
    weights = type(weights)(w13=w13.view(torch.float8_e4m3fn), w2=w2.view(torch.float8_e4m3fn),
                            w13_scale=weights.w13_scale, w2_scale=weights.w2_scale, b13=weights.b13,
                            b2=weights.b2)
    tw, ti = synth.random_routing(spec, 40, mode="counts", counts=[20, 37, 10, 0, 3, 10], seed=42)
    x = synth.random_tokens(spec, 40, seed=43)
    ref = reference.moe_tokens(spec, x, tw, ti, weights, compute_dtype=torch.float64)
    nan_rows = torch.isnan(ref).any(dim=1)
    assert nan_rows.any() and not nan_rows.all()
    assert torch.equal(torch.isnan(ref).all(dim=1), nan_rows)  # a NaN row is NaN throughout
    base = make_kernel(spec, machine_target(), isa)
    prepared = base.prepare_weights(weights)
    for policy in ["tiny", "per_block"] + (["brgemm"] if isa == "avx512bf16" else []):
        out = base.with_policy(policy)(x, tw, ti, prepared)
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), policy
        err = rel_err(out[~nan_rows], ref[~nan_rows])
        assert err <= ACCURACY, f"rel err {err:.3e} on the finite rows ({policy})"
