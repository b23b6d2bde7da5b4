"""bf16 subnormals (|v| < 2^-126) as docs/contract.md states them per ISA build: the avx512bf16
build's vdpbf16ps (and oneDNN's BRGEMM, AMX included) reads subnormal activations and weights as
zero, whatever MXCSR says, so their products vanish; the avx2 build multiplies in fp32 and keeps
them. Here every product is a normal number, so the difference is the inputs' flush alone."""

from __future__ import annotations

import attrs
import pytest
import torch
from cpu_brgemm_helpers import isa_params, machine_target, make_kernel, weights_for
from hal.backends.reference import ops as reference

from hal import synth
from hal.spec import MoESpec
from hal.testing import ACCURACY, rel_err

pytestmark = pytest.mark.cpu

SUBNORMAL = 2.0**-130  # times a standard normal draw: bf16 subnormals (and a few zeros)


def _scaled(t, factor):
    return (t.float() * factor).bfloat16()


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("where", ["activations", "weights"])
def test_subnormal_inputs(isa, where):
    """`activations`: every x subnormal, w13 scaled up by 2^120 so x W13^T is normal. `weights`:
    every w2 subnormal, x scaled up by 2^40 so h W2^T is normal."""
    spec = MoESpec(num_experts=4, top_k=2, hidden_size=64, intermediate_size=96, weight_format="bf16",
                   activation="relu2")
    weights = weights_for(spec, seed=71)
    x = synth.random_tokens(spec, 40, seed=72)
    if where == "activations":
        x = _scaled(x, SUBNORMAL)
        weights = attrs.evolve(weights, w13=_scaled(weights.w13, 2.0**120))
        flushed = (x.float().abs() < 2.0**-126).float().mean()
    else:
        x = _scaled(x, 2.0**40)
        weights = attrs.evolve(weights, w2=_scaled(weights.w2, SUBNORMAL))
        flushed = (weights.w2.float().abs() < 2.0**-126).float().mean()
    assert flushed == 1.0
    tw, ti = synth.random_routing(spec, 40, mode="counts", counts=[3, 40, 30, 7], seed=73)
    ref = reference.moe_tokens(spec, x, tw, ti, weights, compute_dtype=torch.float64)
    assert torch.isfinite(ref).all() and (ref != 0).float().mean() > 0.5
    base = make_kernel(spec, machine_target(), isa)
    prepared = base.prepare_weights(weights)
    for policy in ["tiny", "per_block"] + (["brgemm"] if isa == "avx512bf16" else []):
        out = base.with_policy(policy)(x, tw, ti, prepared)
        if isa == "avx512bf16":
            assert torch.equal(out, torch.zeros_like(out)), policy
        else:
            err = rel_err(out, ref)
            assert err <= ACCURACY, f"rel err {err:.3e} ({policy})"
