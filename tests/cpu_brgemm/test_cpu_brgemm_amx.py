"""On a host with usable AMX: the default policy really takes BRGEMM for blocks over the threshold,
and BRGEMM on AMX agrees with the reference at model widths (K = 2880, 7168)."""

from __future__ import annotations

import pytest
from cpu_brgemm_helpers import check_against_reference, machine_target, make_kernel, weights_for
from hal.backends.cpu_brgemm.policy import BRGEMM_MIN_ROWS

from hal import synth
from hal.spec import MoESpec

pytestmark = [pytest.mark.amx, pytest.mark.cpu]


def test_brgemm_is_supported_and_chosen_per_block():
    spec = MoESpec(num_experts=6, top_k=2, hidden_size=256, intermediate_size=128,
                   weight_format="fp8_block128")
    kernel = make_kernel(spec, machine_target(), "avx512bf16")
    assert kernel.brgemm_supported, "AMX usable per the probe, but torch does not pack bf16 for it"
    tw, ti = synth.random_routing(spec, 33, mode="counts", counts=[4, 5, 33, 0, 20, 4], seed=1)
    plan = kernel.plan(ti)
    for b in plan.blocks:
        want = "brgemm" if b.m_size > BRGEMM_MIN_ROWS else "tiny"
        assert b.stage1 == b.stage2 == want
    weights = weights_for(spec, seed=2)
    prepared = kernel.prepare_weights(weights)
    x = synth.random_tokens(spec, 33, seed=3)
    for policy in ("per_block", "global", "tiny", "brgemm"):
        check_against_reference(kernel.with_policy(policy), weights, prepared, x, tw, ti)


@pytest.mark.parametrize("fmt,hidden,inter,activation,bias,local", [
    ("mxfp4", 2880, 256, "swiglu_oai", True, None),
    ("fp8_block128", 7168, 256, "silu", False, 4),
    ("bf16", 2048, 768, "silu", False, None),
])
def test_model_widths_on_amx(fmt, hidden, inter, activation, bias, local):
    spec = MoESpec(num_experts=8, top_k=4, hidden_size=hidden, intermediate_size=inter,
                   weight_format=fmt, activation=activation, has_bias=bias, num_local_experts=local)
    kernel = make_kernel(spec, machine_target(), "avx512bf16")
    weights = weights_for(spec, seed=4)
    prepared = kernel.prepare_weights(weights)
    for m, mode in ((1, "uniform"), (64, "concentrated"), (200, "uniform")):
        x = synth.random_tokens(spec, m, seed=m)
        tw, ti = synth.random_routing(spec, m, mode=mode, seed=m + 7)
        for policy in ("per_block", "global"):
            check_against_reference(kernel.with_policy(policy), weights, prepared, x, tw, ti)
