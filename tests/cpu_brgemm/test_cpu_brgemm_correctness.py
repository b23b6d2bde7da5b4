"""cpu_brgemm against the float64 reference: formats x activations x bias x EP, under every
dispatch policy and both ISA builds, with poisoned outputs."""

from __future__ import annotations

import pytest
import torch
from cpu_brgemm_helpers import check_against_reference, isa_params, machine_target, make_kernel, weights_for
from hal.backends.cpu_brgemm.policy import BLOCK_M, BLOCK_N, BRGEMM_L2_BYTES, POLICIES

from hal import synth
from hal.spec import MoESpec

pytestmark = pytest.mark.cpu

# Small layers: H != I, both multiples of 32 but not of 128 (ragged fp8 scale blocks).
H, I = 96, 160


def _policies(isa):
    return [p for p in POLICIES if p != "brgemm" or isa == "avx512bf16"]


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("fmt,activation,bias,ep", [
    ("bf16", "silu", False, False),
    ("fp8_block128", "silu", False, False),
    ("fp8_block128", "silu", True, True),
    ("fp8_block128", "swiglu_oai", True, False),
    ("fp8_block128", "relu2", False, True),
    ("mxfp4", "swiglu_oai", True, False),
    ("mxfp4", "swiglu_oai", True, True),
    ("mxfp4", "silu", False, False),
])
def test_formats_activations_bias_ep(isa, fmt, activation, bias, ep):
    spec = MoESpec(num_experts=16, top_k=3, hidden_size=H, intermediate_size=I, weight_format=fmt,
                   activation=activation, has_bias=bias, num_local_experts=6 if ep else None)
    weights = weights_for(spec, seed=3)
    base = make_kernel(spec, machine_target(), isa)
    prepared = base.prepare_weights(weights)
    for m in (1, 7, 40):
        x = synth.random_tokens(spec, m, seed=m)
        tw, ti = synth.random_routing(spec, m, seed=m + 100)
        for policy in _policies(isa):
            check_against_reference(base.with_policy(policy), weights, prepared, x, tw, ti)


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("fmt", ["fp8_block128", "mxfp4"])
def test_blocks_either_side_of_threshold(isa, fmt):
    """Experts receive exactly 4, 5, 33 and 0 routes: blocks of 4 and 5 rows straddle the BRGEMM
    threshold, 33 rows spans two blocks (32 + 1); under every policy."""
    spec = MoESpec(num_experts=6, top_k=2, hidden_size=H, intermediate_size=I, weight_format=fmt,
                   activation="swiglu_oai" if fmt == "mxfp4" else "silu", has_bias=fmt == "mxfp4")
    weights = weights_for(spec, seed=5)
    counts = [4, 5, 33, 0, 20, 4]  # sum 66 = 33 tokens x top_k 2
    tw, ti = synth.random_routing(spec, 33, mode="counts", counts=counts, seed=6)
    x = synth.random_tokens(spec, 33, seed=7)
    base = make_kernel(spec, machine_target(), isa)
    prepared = base.prepare_weights(weights)
    outs = {}
    for policy in _policies(isa):
        outs[policy] = check_against_reference(base.with_policy(policy), weights, prepared, x, tw, ti)
    plan = base.plan(ti)
    assert [(b.expert, b.m_size) for b in plan.blocks] == [(0, 4), (1, 5), (2, 32), (2, 1),
                                                            (4, 20), (5, 4)]


@pytest.mark.parametrize("isa", isa_params())
def test_all_tokens_on_one_expert_and_many_tokens(isa):
    spec = MoESpec(num_experts=8, top_k=2, hidden_size=64, intermediate_size=96,
                   weight_format="fp8_block128")
    weights = weights_for(spec, seed=9)
    base = make_kernel(spec, machine_target(), isa)
    prepared = base.prepare_weights(weights)
    for m, mode in ((300, "one_expert"), (257, "uniform"), (129, "concentrated")):
        x = synth.random_tokens(spec, m, seed=m)
        tw, ti = synth.random_routing(spec, m, mode=mode, seed=m + 1, hot_expert=3)
        for policy in _policies(isa):
            check_against_reference(base.with_policy(policy), weights, prepared, x, tw, ti)


@pytest.mark.parametrize("isa", isa_params())
def test_ep_tokens_with_no_local_route_get_zero(isa):
    spec = MoESpec(num_experts=16, top_k=2, hidden_size=64, intermediate_size=64,
                   weight_format="mxfp4", num_local_experts=4)
    weights = weights_for(spec, seed=11)
    local = torch.nonzero(weights.expert_map >= 0).flatten()
    remote = torch.nonzero(weights.expert_map < 0).flatten()
    ti = torch.stack([remote[:2], torch.stack([local[0], remote[2]]), remote[3:5]]).to(torch.int32)
    tw = torch.softmax(torch.randn(3, 2), dim=-1)
    x = synth.random_tokens(spec, 3, seed=12)
    kernel = make_kernel(spec, machine_target(), isa)
    out = check_against_reference(kernel, weights, kernel.prepare_weights(weights), x, tw, ti)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[2], torch.zeros_like(out[2]))
    assert out[1].abs().sum() > 0
    # No local route at all: nothing is computed and out is all zeros.
    ti_remote = remote[:6].view(3, 2).to(torch.int32)
    out = kernel(x, tw, ti_remote, kernel.prepare_weights(weights))
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("isa", isa_params())
def test_deterministic_and_bf16_topk_weights(isa):
    spec = MoESpec(num_experts=8, top_k=4, hidden_size=128, intermediate_size=64,
                   weight_format="bf16", activation="relu2", has_bias=True)
    weights = weights_for(spec, seed=13)
    kernel = make_kernel(spec, machine_target(), isa)
    prepared = kernel.prepare_weights(weights)
    x = synth.random_tokens(spec, 50, seed=14)
    tw, ti = synth.random_routing(spec, 50, seed=15)
    first = check_against_reference(kernel, weights, prepared, x, tw.bfloat16(), ti.long())
    again = kernel(x, tw.bfloat16(), ti.long(), prepared)
    assert torch.equal(first, again)
    assert kernel(x[:0], tw[:0], ti[:0], prepared).shape == (0, 128)


@pytest.mark.parametrize("isa", isa_params())
def test_fp8_zero_and_subnormals_decode_exactly(isa):
    """Weights made only of e4m3 zeros and subnormals (m x 2^-9): a converter that flushes or
    mis-scales them is off by far more than the tolerance."""
    spec = MoESpec(num_experts=4, top_k=1, hidden_size=64, intermediate_size=64,
                   weight_format="fp8_block128", activation="relu2")
    g = torch.Generator().manual_seed(17)
    weights = synth.random_weights(spec, seed=17)
    subnormal_bits = lambda shape: (torch.randint(0, 8, shape, generator=g)  # noqa: E731
                                    | (torch.randint(0, 2, shape, generator=g) << 7)).to(torch.uint8)
    w13 = subnormal_bits(weights.w13.shape).view(torch.float8_e4m3fn)
    w2 = subnormal_bits(weights.w2.shape).view(torch.float8_e4m3fn)
    weights = type(weights)(w13=w13, w2=w2, w13_scale=torch.full_like(weights.w13_scale, 64.0),
                            w2_scale=torch.full_like(weights.w2_scale, 64.0))
    kernel = make_kernel(spec, machine_target(), isa, policy="tiny")
    prepared = kernel.prepare_weights(weights)
    x = synth.random_tokens(spec, 9, seed=18)
    tw, ti = synth.random_routing(spec, 9, seed=19)
    policies = ["tiny", "brgemm"] if isa == "avx512bf16" else ["tiny"]
    for policy in policies:
        check_against_reference(kernel.with_policy(policy), weights, prepared, x, tw, ti)


@pytest.mark.parametrize("isa", isa_params())
def test_brgemm_panel_groups_with_ragged_last_group(isa):
    """K = 4096 leaves room in the L2 budget (BRGEMM_L2_BYTES) for two gate/up panel pairs per
    BRGEMM item, so the five panels of I = 160 run as groups of 2, 2 and 1; TinyGEMM blocks share
    the items."""
    spec = MoESpec(num_experts=4, top_k=2, hidden_size=4096, intermediate_size=160,
                   weight_format="fp8_block128", has_bias=True)
    activations, pair = BLOCK_M * 4096 * 2, 2 * 4096 * BLOCK_N * 2  # bf16 bytes
    assert (BRGEMM_L2_BYTES - activations) // pair == 2
    weights = weights_for(spec, seed=21)
    base = make_kernel(spec, machine_target(), isa)
    prepared = base.prepare_weights(weights)
    tw, ti = synth.random_routing(spec, 40, mode="counts", counts=[40, 3, 37, 0], seed=22)
    x = synth.random_tokens(spec, 40, seed=23)
    for policy in _policies(isa):
        check_against_reference(base.with_policy(policy), weights, prepared, x, tw, ti)


@pytest.mark.avx512
@pytest.mark.parametrize("fmt", ["fp8_block128", "mxfp4"])
def test_per_block_mixed_runs(fmt):
    """per_block as it runs on AMX: blocks over the threshold on BRGEMM, small ones (a 33-route
    expert's 1-row tail included, which reads the panel its run already dequantized) on TinyGEMM.
    oneDNN's BRGEMM also runs on plain AVX-512, so the kernel is told BRGEMM is supported here."""
    spec = MoESpec(num_experts=6, top_k=2, hidden_size=H, intermediate_size=I, weight_format=fmt,
                   activation="swiglu_oai" if fmt == "mxfp4" else "silu", has_bias=True)
    weights = weights_for(spec, seed=25)
    kernel = make_kernel(spec, machine_target(), "avx512bf16")
    kernel._brgemm_supported = True  # as probed on an AMX host
    tw, ti = synth.random_routing(spec, 33, mode="counts", counts=[4, 5, 33, 0, 20, 4], seed=26)
    paths = [(b.m_size, b.stage1) for b in kernel.plan(ti).blocks]
    assert paths == [(4, "tiny"), (5, "brgemm"), (32, "brgemm"), (1, "tiny"), (20, "brgemm"),
                     (4, "tiny")]
    x = synth.random_tokens(spec, 33, seed=27)
    for policy in ("per_block", "global"):
        variant = kernel.with_policy(policy)
        assert variant.brgemm_supported
        check_against_reference(variant, weights, kernel.prepare_weights(weights), x, tw, ti)


@pytest.mark.parametrize("isa", isa_params())
def test_any_thread_count_gives_the_same_bytes(isa):
    """A call runs gather, both stages and the reduce from one queue of tasks, where an expert's
    stage-2 items wait for its stage-1 items: with 1 thread and with more threads than this CPU
    has cores every wait must end, and the bytes must not depend on the thread count. No expert
    here mixes a BRGEMM block with a TinyGEMM one, whose shared run (and so its rounding) follows
    the thread count."""
    spec = MoESpec(num_experts=8, top_k=2, hidden_size=H, intermediate_size=I,
                   weight_format="fp8_block128", has_bias=True)
    weights = weights_for(spec, seed=31)
    kernel = make_kernel(spec, machine_target(), isa)
    prepared = kernel.prepare_weights(weights)
    tw, ti = synth.random_routing(spec, 45, mode="counts", counts=[40, 3, 37, 1, 0, 2, 5, 2], seed=32)
    x = synth.random_tokens(spec, 45, seed=33)
    before = torch.get_num_threads()
    try:
        outs = {}
        for threads in (2, 1, 3, 5):
            torch.set_num_threads(threads)
            outs[threads] = check_against_reference(kernel, weights, prepared, x, tw, ti)
    finally:
        torch.set_num_threads(before)
    for threads in (1, 3, 5):
        assert torch.equal(outs[threads], outs[2]), f"{threads} threads differ from 2"
