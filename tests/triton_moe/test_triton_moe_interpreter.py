"""triton_moe's Triton kernels in the interpreter on CPU (TRITON_INTERPRET=1), tiny shapes: the
route grouping against a torch grouping, and whole layers against the float64 oracle for every
weight format and activation, with bias, EP maps and -1 routes. The interpreter's 16-bit dot is
wrong and its fp32 -> bf16 cast truncates, so the layers run fp32 dots (dot_f32, the default
there) on float16 activations; the GPU tests cover bf16."""

from __future__ import annotations

import attrs
import pytest
import torch
from hal.backends.reference import activation, dequant
from hal.backends.triton_moe import configs
from hal.backends.triton_moe import kernel as kernel_module
from hal.backends.triton_moe.kernel import TritonMoEKernel

import hal
from hal import presets
from hal.backend import Target
from hal.synth import random_expert_map, random_routing, random_tokens
from hal.testing import ACCURACY, is_poison, poison, rel_err

pytestmark = pytest.mark.usefixtures("interpreter")

CPU = Target("cpu", hal.Caps())


def small_spec(fmt="bf16", activation="silu", bias=False, ep=False, experts=6, top_k=2, H=256, I=128):
    return hal.MoESpec(num_experts=experts, top_k=top_k, hidden_size=H, intermediate_size=I,
                       weight_format=fmt, activation=activation, has_bias=bias, act_dtype="float16",
                       num_local_experts=experts - 2 if ep else None)


def expected_runs(spec, topk_ids, expert_map):
    ids = topk_ids.long().flatten()
    ok = (ids >= 0) & (ids < spec.num_experts)
    local = torch.where(ok, ids.clamp(0, spec.num_experts - 1), 0)
    if expert_map is not None:
        local = expert_map.long()[local]
    local = torch.where(ok, local, -1)
    return {e: sorted(torch.nonzero(local == e).flatten().tolist()) for e in range(spec.local_experts)}


@pytest.mark.parametrize("tokens", [7, 1500])  # one program, and two launches over several programs
@pytest.mark.parametrize("ep", [False, True])
def test_grouping_matches_torch(tokens, ep):
    spec = small_spec(ep=ep, experts=9, top_k=2)
    expert_map = random_expert_map(spec, seed=3) if ep else None
    _, ids = random_routing(spec, tokens, "concentrated", seed=tokens)
    ids[0, 0], ids[1, 1] = -1, spec.num_experts + 5  # dropped, and out of range with check=False
    kernel = TritonMoEKernel(spec, CPU)
    bm = kernel.config(tokens).block_m
    sorted_routes, block_expert = _run_grouping(kernel, spec, ids, expert_map)
    routes = tokens * spec.top_k
    runs = {e: [] for e in range(spec.local_experts)}
    for b, e in enumerate(block_expert.tolist()):
        rows = sorted_routes[b * bm:(b + 1) * bm].tolist()
        if e < 0:
            assert all(r == routes for r in rows), "a row past the used blocks is not a pad"
            continue
        live = [r for r in rows if r != routes]
        assert rows[:len(live)] == live, "pads sit inside a block before its routes"
        runs[e] += live
    used = block_expert[block_expert >= 0]
    assert bool((used[1:] >= used[:-1]).all()), "blocks are not in expert order"
    assert {e: sorted(r) for e, r in runs.items()} == expected_runs(spec, ids, expert_map)


def _run_grouping(kernel, spec, ids, expert_map):
    M = ids.shape[0]
    x = torch.zeros(M, spec.hidden_size, dtype=torch.float16)
    data = kernel_module.TritonMoEWeights(torch.zeros(1), torch.zeros(1), None, None, None, None,
                                          expert_map, 1, spec.intermediate_size)
    call = kernel.launches(x, torch.ones(ids.shape), ids, data, torch.empty_like(x))
    names = [name for name, _ in call.stages]
    one_program = M * spec.top_k <= kernel_module.ALIGN_ONE_PROGRAM_ROUTES
    assert names[:-3] == (["align"] if one_program else ["count_routes", "scatter_routes"])
    for _, launch in call.stages[:-3]:
        launch()
    return call.scratch["sorted_routes"], call.scratch["block_expert"]


def run_layer(spec, M, oracle, weights_for, kernel=None, drop=0.15, seed=0, accuracy=ACCURACY):
    kernel = kernel or TritonMoEKernel(spec, CPU)
    w = weights_for(spec, seed, "cpu")
    prepared = kernel.prepare_weights(w)
    x = random_tokens(spec, M, seed=seed + 2)
    tw, ti = random_routing(spec, M, seed=seed + 3)
    ti = torch.where(torch.rand(ti.shape, generator=torch.Generator().manual_seed(seed)) < drop, -1, ti)
    out = poison(torch.empty_like(x))
    kernel(x, tw, ti, prepared, out=out, check=False)
    assert not bool(is_poison(out).any()), "an output element was not written"
    err = rel_err(out, oracle(spec, x, tw, ti, w))
    assert err <= accuracy, f"{spec} M={M}: rel err {err:.3g} ({kernel.plan(M).describe()})"


@pytest.mark.parametrize("fmt,activation,bias,ep", [
    ("bf16", "silu", False, True),
    ("bf16", "relu2", True, False),
    ("fp8_block128", "swiglu_oai", True, True),
    ("mxfp4", "swiglu_oai", True, False),
    ("mxfp4", "silu", False, True),
    ("int4_g128", "swiglu_oai", True, True),
    ("int4_g128", "relu2", False, False),
])
def test_layer_matches_oracle(fmt, activation, bias, ep, oracle, weights_for):
    H, I = {"bf16": (200, 72), "fp8_block128": (200, 136), "mxfp4": (224, 96),
            "int4_g128": (256, 128)}[fmt]
    run_layer(small_spec(fmt, activation, bias, ep, H=H, I=I), 5, oracle, weights_for)


@pytest.mark.parametrize("fmt,activation,H,I", [
    ("bf16", "silu", 200, 72),
    ("fp8_block128", "swiglu_oai", 200, 136),
    ("mxfp4", "swiglu_oai", 224, 96),
    ("mxfp4", "relu2", 224, 96),
])
def test_decode_gemv(fmt, activation, H, I, oracle, weights_for):
    """Few routes over many experts: GEMV 1 per route, GEMV 2 with the top-k sum (two launches),
    with bias, EP and dropped routes."""
    spec = small_spec(fmt, activation, bias=True, ep=True, experts=16, H=H, I=I)
    # bf16 takes it on request only; mxfp4 on the checkpoint layout (repacked mxfp4 runs the GEMMs).
    path = {"mxfp4": "bits"}.get(fmt)
    kernel = TritonMoEKernel(spec, CPU, gemv=True, mxfp4_path=path)
    assert kernel.plan(2).launches == 2
    run_layer(spec, 2, oracle, weights_for, kernel=kernel, drop=0.25)


@pytest.mark.parametrize("fmt,activation,H,I", [
    ("bf16", "swiglu_oai", 200, 72),
    ("int4_g128", "silu", 256, 128),
    ("fp8_block128", "relu2", 200, 136),
])
def test_per_route_blocks(fmt, activation, H, I, oracle, weights_for):
    """Few routes through the GEMMs: one block per route, no grouping launch (three launches),
    with bias and dropped routes (not under EP: there the routes are grouped)."""
    spec = small_spec(fmt, activation, bias=True, experts=16, H=H, I=I)
    kernel = TritonMoEKernel(spec, CPU, gemv=False)
    plan = kernel.plan(2)
    assert plan.config.per_route and plan.launches == 3
    run_layer(spec, 2, oracle, weights_for, kernel=kernel, drop=0.25)


def split_k_kernel(spec, tokens, split1, split2, **options):
    """The rule's kernel with K split split1 / split2 ways in GEMM 1 / 2 at `tokens`."""
    kernel = TritonMoEKernel(spec, CPU, **options)
    config = kernel.config(tokens)
    kernel._configs[config.tokens_bucket] = attrs.evolve(
        config, gemm1=attrs.evolve(config.gemm1, split_k=split1),
        gemm2=attrs.evolve(config.gemm2, split_k=split2))
    return kernel


@pytest.mark.parametrize("fmt,activation,ep,split1,split2,options", [
    ("int4_g128", "swiglu_oai", True, 4, 2, {}),  # repacked: gate and up rows in one swap-AB tile
    ("int4_g128", "silu", False, 3, 2, {"int4_path": "checkpoint"}),  # an odd split of 8 K steps
    ("bf16", "silu", True, 2, 4, {}),  # gate and up, two accumulators
    ("bf16", "relu2", False, 4, 1, {"gemv": False}),  # per-route blocks, one accumulator
    ("fp8_block128", "swiglu_oai", True, 2, 2, {"fp8_act": True}),  # w8a8: h quantized in GEMM 2
    ("mxfp4", "silu", False, 2, 3, {}),
])
def test_split_k(fmt, activation, ep, split1, split2, options, oracle, oracle_w8a8, weights_for):
    """K split over programs: each split stores its partial, the last to arrive sums them in split
    order and runs the epilogue; with bias, EP maps and dropped routes."""
    per_route = options.get("gemv") is False  # 2 tokens x 2 routes x 4 <= 16 experts
    tokens, experts = (2, 16) if per_route else (3, 8)
    spec = small_spec(fmt, activation, bias=True, ep=ep, experts=experts, H=1024, I=512)
    kernel = split_k_kernel(spec, tokens, split1, split2, **options)
    plan = kernel.plan(tokens)
    assert (plan.config.gemm1.split_k, plan.config.gemm2.split_k) == (split1, split2)
    assert plan.config.per_route == per_route
    if options.get("fp8_act"):
        oracle = oracle_w8a8
    run_layer(spec, tokens, oracle, weights_for, kernel=kernel, drop=0.25)


def test_split_k_runs_again_on_its_scratch(oracle, weights_for):
    """The last split of a tile sets its counter back to zero: GEMM 1 and GEMM 2 launched a second
    time over the same scratch (as a benchmark timing one stage does) write the same output."""
    spec = small_spec("int4_g128", "silu", ep=True, experts=8, H=1024, I=256)
    kernel = split_k_kernel(spec, 2, 4, 2)
    w = kernel.prepare_weights(weights_for(spec, 0, "cpu"))
    x = random_tokens(spec, 2, seed=2)
    tw, ti = random_routing(spec, 2, seed=3)
    out = poison(torch.empty_like(x))
    call = kernel.launches(x, tw, ti, w.data, out)
    for _, launch in call.stages:
        launch()
    first = out.clone()
    out.copy_(poison(torch.empty_like(x)))
    for _, launch in call.stages:
        launch()
    assert torch.equal(out, first)


def test_split_k_rule():
    """The rule splits K only where a decode GEMM of 4-bit weights would leave SMs idle, and keeps
    16 K steps per split: deepseek-v3's EP rank at 1 token on an H200 (one block: GEMM 1's 64 N
    tiles of 56 K steps for 132 SMs; GEMM 2's 16 K steps stay whole), not in bf16."""
    gpu = hal.probe(profile="h200").gpus[0]
    rank = presets.get("deepseek-v3").spec("int4_g128", num_local_experts=32)
    one = configs.choose(rank, gpu, 1)
    assert (one.gemm1.split_k, one.gemm2.split_k) == (2, 1)
    assert any("K split 2/1" in r for r in one.reasons)
    assert configs.choose(rank, gpu, 8).gemm1.split_k == 1  # 8 blocks: 512 programs
    bf16 = presets.get("deepseek-v3").spec("bf16", num_local_experts=32)
    assert configs.choose(bf16, gpu, 1).gemm1.split_k == 1
    whole = presets.get("qwen3-30b-a3b").spec("int4_g128")
    assert configs.choose(whole, gpu, 1).gemm1.split_k == 1
    assert configs.split_k_for(64, 7168, 128, 132) == 2
    assert configs.split_k_for(16, 14336, 128, 132) == 4  # 112 K steps: 8 splits would hold 14
    assert configs.split_k_for(10, 2048, 128, 132) == 1  # 16 K steps: a split would hold fewer
    assert configs.split_k_for(200, 7168, 128, 132) == 1


@pytest.mark.parametrize("path", ["repacked", "checkpoint"])
def test_int4_paths(path, oracle, weights_for):
    """int4 repacked (gate and up rows interleaved from swiglu_oai's interleaved columns) and on
    GPTQ's own layout (the columns de-interleaved)."""
    spec = small_spec("int4_g128", "swiglu_oai", True, True, H=256, I=128)
    run_layer(spec, 5, oracle, weights_for, kernel=TritonMoEKernel(spec, CPU, int4_path=path))


def test_int4_per_channel(oracle, weights_for):
    """group_size -1: one scale per output column over all of K."""
    spec = hal.MoESpec(num_experts=6, top_k=2, hidden_size=192, intermediate_size=64,
                       weight_format="int4_g128", group_size=-1, has_bias=True, act_dtype="float16")
    run_layer(spec, 4, oracle, weights_for)


@pytest.mark.parametrize("fmt,H,I", [("fp8_block128", 200, 136), ("int4_g128", 256, 128)])
def test_prefill_tiles(fmt, H, I, oracle, weights_for):
    """64 routes per expert: BLOCK_M 64, the prefill tile shapes and blocks walking the N tiles in
    groups, asked for (int4 reads its quantization group size in every K step beside the grouping)."""
    spec = small_spec(fmt, bias=True, experts=4, top_k=2, H=H, I=I)
    kernel = TritonMoEKernel(spec, CPU, grouped_n=True)  # the rule groups only wider layers
    assert kernel.plan(130).config.gemm1.group_m > 1
    run_layer(spec, 130, oracle, weights_for, kernel=kernel)


@pytest.mark.parametrize("M", [5, 130])  # decode and prefill tiles
def test_fp8_swap_ab(M, oracle, weights_for):
    """fp8 w8a16 with the weights as the dot's first operand (on request only)."""
    spec = small_spec("fp8_block128", "swiglu_oai", bias=True, ep=True, experts=4, H=200, I=136)
    kernel = TritonMoEKernel(spec, CPU, swap_ab=True)
    assert kernel.plan(M).config.gemm1.swap_ab
    run_layer(spec, M, oracle, weights_for, kernel=kernel)


@pytest.mark.parametrize("M,activation,H,I,swap_ab,experts,top_k", [
    (6, "silu", 200, 136, None, 6, 2),  # decode: swap-AB, 64-wide N tiles, h quantized in GEMM 2
    (6, "relu2", 200, 136, False, 6, 2),  # decode in the usual operand order
    (4, "swiglu_oai", 128, 2048, None, 16, 8),  # decode, 128-wide N tiles: h from GEMM 1's epilogue
    (130, "swiglu_oai", 200, 200, None, 6, 2),  # prefill, I % 128 != 0
    (130, "silu", 200, 256, None, 6, 2),
    (130, "relu2", 200, 256, True, 6, 2),  # prefill with swap-AB
])
def test_w8a8(M, activation, H, I, swap_ab, experts, top_k, oracle_w8a8, weights_for):
    """x quantized by the launch before GEMM 1 at every size; h by GEMM 1's epilogue (128-wide N
    tiles) or in GEMM 2's registers."""
    spec = small_spec("fp8_block128", activation, bias=True, ep=True, experts=experts, top_k=top_k, H=H, I=I)
    kernel = TritonMoEKernel(spec, CPU, fp8_act=True, swap_ab=swap_ab)
    plan = kernel.plan(M)
    config = plan.config
    assert config.fp8_act and config.gemm1.swap_ab == ((M < 64 and swap_ab is None) or bool(swap_ab))
    assert "quantize x" in plan.describe()
    assert config.h_fp8 == (config.gemm1.block_n == 128) == (M >= 64 or I == 2048)
    run_layer(spec, M, oracle_w8a8, weights_for, kernel=kernel)


@pytest.mark.parametrize("M,activation,experts,I", [
    (2, "silu", 16, 136),  # few routes: the exact numerics would take the 16-bit GEMV here
    (6, "swiglu_oai", 6, 136),  # decode: h quantized in GEMM 2
    (4, "silu", 16, 2048),  # 128-wide N tiles: h from GEMM 1's epilogue
    (130, "relu2", 6, 256),
])
def test_act_quant_fp8_runs_w8a8(M, activation, experts, I, oracle, weights_for):
    """A spec that asks for act_quant="fp8_g128" runs w8a8 through the grouped GEMMs at every size
    and is held to the oracle of those numerics, which models the quantization."""
    spec = attrs.evolve(small_spec("fp8_block128", activation, bias=True, ep=True, experts=experts,
                                   H=200, I=I), act_quant="fp8_g128")
    kernel = TritonMoEKernel(spec, CPU)
    config = kernel.plan(M).config
    assert config.fp8_act and config.gemv1 is None and config.act_terms == 1
    run_layer(spec, M, oracle, weights_for, kernel=kernel, drop=0.25)


@pytest.mark.parametrize("options", [{"fp8_act": False}, {"fp8_act": "x2"}, {"gemv": True}])
def test_act_quant_fp8_refuses_other_numerics(options):
    spec = attrs.evolve(small_spec("fp8_block128"), act_quant="fp8_g128")
    with pytest.raises(ValueError, match="act_quant"):
        TritonMoEKernel(spec, CPU, **options)


def test_w8a8_asked_for_keeps_the_gemv(oracle, weights_for):
    """Few routes over many experts: with fp8_act=True the rule keeps the w8a16 GEMV path (faster
    there, and within the contract of the plain oracle)."""
    spec = small_spec("fp8_block128", "silu", bias=True, ep=True, experts=16, H=200, I=136)
    kernel = TritonMoEKernel(spec, CPU, fp8_act=True)
    config = kernel.plan(2).config
    assert config.gemv1 is not None and not config.fp8_act
    run_layer(spec, 2, oracle, weights_for, kernel=kernel, drop=0.25)


def _check_terms(q, scale, ref, terms, check_e4m3_groups, dequantize_groups):
    """q [rows, terms * cols] (the high terms, then the low ones) and scale [rows, groups] against
    the float64 values they stand for: the high term is the e4m3 of the value, the low term the
    e4m3 of what the high one leaves, in units of the same scale. Returns the float64 values the
    terms sum to."""
    cols = ref.shape[1]
    hi = dequantize_groups(q[:, :cols], scale)
    check_e4m3_groups(q[:, :cols], scale, ref)
    if terms == 1:
        return hi
    lo = dequantize_groups(q[:, cols:], scale)
    rest = ref - hi
    s = dequantize_groups(torch.ones_like(q[:, :cols], dtype=torch.float64), scale)
    # e4m3 rounding of the remainder (2^-4 relative, 2^-10 of the scale below the normal range), plus
    # the fp32 arithmetic it was computed in, a few fp32 roundings of values up to 448 scales.
    bound = torch.maximum(rest.abs() * 2.0**-4, s * 2.0**-10) + s * 448 * 1e-5
    assert bool(((lo - rest).abs() <= bound).all()), "a low term is off by more than rounding"
    assert bool((q[:, cols:].double().abs() <= 32).all()), "a low term is over one e4m3 step of 448"
    return hi + lo


@pytest.mark.parametrize("I,fp8_act,M", [(256, True, 130), (200, True, 130), (200, "x2", 130),
                                         (200, "x2", 1100)])
def test_w8a8_quantized_activations(I, fp8_act, M, weights_for, e4m3_groups):
    """The per-call quantization of x (in the grouping's first launch: one program groups 260
    routes, 2200 are counted over several) and GEMM 1's fp8 epilogue, read between the launches:
    the e4m3 values and scales of x, and of h against the float64 activation of x's own e4m3
    values (fp32 dots in the interpreter, so h is exact to fp32 rounding before it is quantized;
    w8a8 rounds it to x's dtype first); with fp8_act="x2" both terms of each."""
    spec = small_spec("fp8_block128", "silu", bias=True, experts=4, top_k=2, H=200, I=I)
    kernel = TritonMoEKernel(spec, CPU, fp8_act=fp8_act)
    terms = kernel.plan(M).config.act_terms
    assert terms == (2 if fp8_act == "x2" else 1)
    w = weights_for(spec, 0, "cpu")
    prepared = kernel.prepare_weights(w)
    x = random_tokens(spec, M, seed=2)
    tw, ti = random_routing(spec, M, seed=3)
    call = kernel.launches(x, tw, ti, prepared.data, poison(torch.empty_like(x)))
    one_program = M * spec.top_k <= kernel_module.ALIGN_ONE_PROGRAM_ROUTES
    assert call.stages[0][0] == ("align_quantize_x" if one_program else "count_routes_quantize_x")
    for name, launch in call.stages:
        launch()
        if name == "gemm1":
            break
    scratch = call.scratch
    assert scratch["x_q"].dtype == torch.float8_e4m3fn and scratch["h"].dtype == torch.float8_e4m3fn
    assert scratch["x_q"].shape == (M, terms * spec.hidden_size)
    x_deq = _check_terms(scratch["x_q"], scratch["x_scale"], x.double(), terms, *e4m3_groups)
    bm = kernel.plan(M).config.block_m
    rows = scratch["sorted_routes"]
    live = torch.nonzero(rows < M * spec.top_k).flatten()
    routes = rows[live].long()
    experts = scratch["block_expert"][live // bm].long()
    w13 = dequant.w13(spec, w, torch.float64)
    g = torch.einsum("rh,rnh->rn", x_deq[routes // spec.top_k], w13[experts])
    g = g + w.b13.double()[experts]
    h_ref = activation.apply(spec, g)
    if terms == 1:  # w8a8 quantizes h as the layer stores it, in the activations' dtype
        h_ref = h_ref.to(x.dtype).double()
    _check_terms(scratch["h"][live], scratch["h_scale"][live], h_ref, terms, *e4m3_groups)


@pytest.mark.parametrize("M,activation,H,I,swap_ab", [
    (6, "silu", 200, 136, None),  # decode: swap-AB, 64-wide N tiles, h quantized in GEMM 2
    (4, "swiglu_oai", 128, 2048, None),  # decode, 128-wide N tiles: h from GEMM 1's epilogue
    (130, "relu2", 200, 256, None),  # prefill
    (130, "silu", 200, 200, True),  # prefill with swap-AB, I % 128 != 0
])
def test_w8a8x2(M, activation, H, I, swap_ab, oracle, weights_for):
    """Two e4m3 terms per activation: against the plain float64 oracle, within half the contract
    (about 1e-3 here; one term, w8a8, is 3.6-4.4% off on these layers)."""
    experts, top_k = (16, 8) if I == 2048 else (6, 2)
    spec = small_spec("fp8_block128", activation, bias=True, ep=True, experts=experts, top_k=top_k, H=H, I=I)
    kernel = TritonMoEKernel(spec, CPU, fp8_act="x2", swap_ab=swap_ab)
    config = kernel.plan(M).config
    assert config.fp8_act and config.act_terms == 2 and "two e4m3 terms" in kernel.plan(M).describe()
    run_layer(spec, M, oracle, weights_for, kernel=kernel, accuracy=ACCURACY / 2)


@pytest.mark.parametrize("activation", ["swiglu_oai", "silu", "relu2"])
def test_mxfp4_repacked_prefill(activation, oracle, weights_for):
    """Repacked mxfp4 (the default) at prefill tiles: swap-AB, gate and up rows in one tile (silu's
    checkpoint rows interleaved by prepare_weights), with bias and dropped routes."""
    spec = small_spec("mxfp4", activation, bias=True, experts=4, top_k=2, H=224, I=96)
    assert TritonMoEKernel(spec, CPU).plan(130).config.gemm1.swap_ab
    run_layer(spec, 130, oracle, weights_for)


@pytest.mark.parametrize("M", [5, 130])
def test_mxfp4_repacked_large_scales(M, oracle, weights_for):
    """A few of w13's e8m0 exponents at 129 (scale 4), the rest 6 below the usual range (float16
    activations bound the products): above 128 the repacked path scales in two multiplies
    (2^(e - 1) alone would overflow fp32), for both GEMMs of the layer."""
    spec = small_spec("mxfp4", "silu", bias=True, experts=4, top_k=2, H=224, I=96)

    def weights(spec, seed, device):
        w = weights_for(spec, seed, device)
        g = torch.Generator().manual_seed(seed)
        s = w.w13_scale - 6
        s = torch.where(torch.rand(s.shape, generator=g) < 0.02, torch.full_like(s, 129), s)
        return attrs.evolve(w, w13_scale=s)

    kernel = TritonMoEKernel(spec, CPU)
    assert kernel.prepare_weights(weights(spec, 0, "cpu")).data.scale_high
    run_layer(spec, M, oracle, weights, kernel=kernel)


@pytest.mark.parametrize("swap_ab", [False, True])
def test_mxfp4_dot_scaled(swap_ab, oracle, weights_for):
    """Triton's dot_scaled path, in float16 (the interpreter evaluates it in 16 bits), with the
    packed weights as its second operand or (swap-AB) its first."""
    spec = small_spec("mxfp4", "swiglu_oai", bias=True, H=224, I=96)
    kernel = TritonMoEKernel(spec, CPU, dot_f32=False, mxfp4_path="dot_scaled", swap_ab=swap_ab)
    run_layer(spec, 5, oracle, weights_for, kernel=kernel)


def test_all_dropped_and_zero_tokens(weights_for):
    spec = small_spec(ep=True, H=64, I=32)
    kernel = TritonMoEKernel(spec, CPU)
    prepared = kernel.prepare_weights(weights_for(spec, 0, "cpu"))
    x = random_tokens(spec, 3)
    tw, ti = random_routing(spec, 3)
    assert bool((kernel(x, tw, torch.full_like(ti, -1), prepared, check=False) == 0).all())
    empty = kernel(x[:0], tw[:0], ti[:0], prepared)
    assert empty.shape == (0, spec.hidden_size)


def test_prepare_rejects_bad_expert_map(weights_for):
    spec = small_spec(ep=True, H=64, I=32)
    kernel = TritonMoEKernel(spec, CPU)
    w = weights_for(spec, 0, "cpu")
    bad = w.expert_map.clone()
    bad[0] = spec.local_experts
    with pytest.raises(ValueError, match="expert_map"):
        kernel.prepare_weights(attrs.evolve(w, expert_map=bad))
