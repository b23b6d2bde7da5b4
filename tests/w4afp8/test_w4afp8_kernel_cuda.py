"""The w4afp8 kernels on an NVIDIA GPU with FP8 MMA, real dtypes and DeepSeek-V3 expert shapes:
both feeds against the float64 oracle, bit-equal to each other, rows past masked_m untouched."""

from __future__ import annotations

import attrs
import pytest
import torch
from hal.backends.reference import ops

from hal.spec import MoESpec
from hal.synth import random_expert_map, random_masked_inputs, random_weights
from hal.testing import ACCURACY, is_poison, poison, rel_err

pytestmark = pytest.mark.cuda

DEEPSEEK = dict(num_experts=256, top_k=8, hidden_size=7168, intermediate_size=2048)
MAX_M = 48
MASKS = {
    "ragged": [17, 0, 48, 3, 1, 29, 0, 8],
    "all_empty": [0] * 8,
    "full": [48] * 8,
    "one_expert_takes_all": [0, 0, 0, 48, 0, 0, 0, 0],
    "decode": [1, 2, 0, 1, 4, 1, 0, 3],
}


@pytest.fixture(scope="module")
def target():
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # the real cause: no Triton, or a module it needs (numpy)
        pytest.skip(f"Triton cannot be imported: {exc}")
    from hal.backends.w4afp8 import backend

    import hal
    from hal.backend import Target

    device = f"cuda:{torch.cuda.current_device()}"
    t = Target(device, hal.probe(deep=True))
    verdict = backend.check(MoESpec(**DEEPSEEK, num_local_experts=8, weight_format="w4afp8",
                                    layout="masked"), t)
    if not verdict.ok:
        pytest.skip(f"w4afp8 does not run on this GPU: {verdict.summary()}")
    return t


def spec_of(experts, activation="silu", **shape):
    dims = {**DEEPSEEK, **shape}
    return MoESpec(**dims, num_local_experts=experts, weight_format="w4afp8", layout="masked",
                   activation=activation)


def kernels(spec, target):
    from hal.backends.w4afp8 import backend

    default = backend.build(spec, target)
    return {default.variant: default, **default.baselines()}


def weights_of(spec, device, seed):
    """Random local experts; the expert map is validated under EP, never read by the masked layout."""
    weights = random_weights(spec, device=device, seed=seed)
    return attrs.evolve(weights, expert_map=random_expert_map(spec, seed=seed, device=device))


def oracle(spec, x, scale, masked_m, weights):
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    return ops.moe_masked(spec, x, scale, masked_m, weights, out, compute_dtype=torch.float64)


def run_both(spec, target, counts, max_m, expected_rows, seed, layout="column", runs=None, weights=None):
    """Both feeds on fresh inputs: every live row within ACCURACY of the oracle, every dead row still
    poison, and the two feeds' outputs equal byte for byte. runs: the kernels by name, "requant" and
    "fused" among them (default: the selected kernel and its baselines); weights: fresh ones of
    `seed` unless given."""
    runs = runs or kernels(spec, target)
    weights = weights_of(spec, target.device, seed) if weights is None else weights
    x, scale, masked_m = random_masked_inputs(spec.local_experts, spec.hidden_size, max_m, counts,
                                              seed=seed + 1, device=target.device, scale_layout=layout,
                                              fp8_dtype=runs["fused"].fp8_dtype)
    ref = oracle(spec, x, scale, masked_m, weights)
    outs = {}
    for name, kernel in runs.items():
        out = poison(torch.empty(x.shape, dtype=torch.bfloat16, device=x.device))
        kernel(x, scale, masked_m, kernel.prepare_weights(weights), expected_rows=expected_rows, out=out)
        torch.cuda.synchronize()
        for e, m in enumerate(counts):
            assert bool(is_poison(out[e, m:]).all()), f"{name}: expert {e}: a row >= masked_m was written"
            if m:
                assert not bool(is_poison(out[e, :m]).any()), f"{name}: expert {e}: a live row is unwritten"
                err = rel_err(out[e, :m], ref[e, :m])
                assert err <= ACCURACY, f"{name}: expert {e}: rel err {err:.2e}"
        outs[name] = out
    assert torch.equal(outs["fused"].view(torch.int16), outs["requant"].view(torch.int16)), \
        "the fused feed's in-register requant wrote other bytes than the requant op"


@pytest.mark.parametrize("layout", ["column", "row"])
@pytest.mark.parametrize("mask", list(MASKS))
def test_deepseek_shapes_both_feeds(target, mask, layout):
    counts = MASKS[mask]
    expected = max(1, (sum(counts) + len(counts) - 1) // len(counts))
    run_both(spec_of(8), target, counts, MAX_M, expected, seed=len(mask))


@pytest.mark.parametrize("expected_rows", [None, 1, 16, 24, 200])
def test_every_tile_and_odd_max_m(target, expected_rows):
    """An odd max_m and estimates that pick each tile, including ones far below the real rows (the
    m-programs then walk several m-blocks each)."""
    run_both(spec_of(4), target, [45, 7, 0, 33], 45, expected_rows, seed=11)


@pytest.mark.parametrize("expected_rows", [116, 200])
def test_prefill_rows(target, expected_rows):
    """The 128-row folded tile and, in the per-group baseline, the 128- and 256-row FP8 tiles;
    expert 0 walks two m-blocks of the 128-row tiles."""
    run_both(spec_of(4), target, [256, 130, 0, 77], 256, expected_rows, seed=12)


@pytest.mark.parametrize("activation", ["swiglu_oai", "relu2"])
def test_other_activations(target, activation):
    run_both(spec_of(8, activation, hidden_size=1024, intermediate_size=512), target,
             MASKS["ragged"], MAX_M, 12, seed=13)


def test_many_local_experts_few_rows(target):
    counts = [i % 5 for i in range(32)]
    run_both(spec_of(32, hidden_size=2048, intermediate_size=512), target, counts, 8, 2, seed=14)


def test_masked_m_above_max_m_stays_inside_the_buffer_without_check(target):
    spec = spec_of(2, hidden_size=1024, intermediate_size=256)
    kernel = kernels(spec, target)["fused"]
    weights = weights_of(spec, target.device, 15)
    x, scale, _ = random_masked_inputs(2, 1024, 4, [4, 4], seed=16, device=target.device,
                                       fp8_dtype=kernel.fp8_dtype)
    out = poison(torch.empty(x.shape, dtype=torch.bfloat16, device=x.device))
    bad = torch.tensor([1000, 0], dtype=torch.int32, device=x.device)
    kernel(x, scale, bad, kernel.prepare_weights(weights), out=out, check=False)
    torch.cuda.synchronize()
    assert not bool(is_poison(out[0]).any()) and bool(is_poison(out[1]).all())


def test_fused_feed_replays_in_a_cuda_graph(target):
    """check=False makes no host sync, so a DeepEP decode step can be captured."""
    spec = spec_of(8)
    kernel = kernels(spec, target)["fused"]
    weights = weights_of(spec, target.device, 17)
    prepared = kernel.prepare_weights(weights)
    x, scale, masked_m = random_masked_inputs(8, spec.hidden_size, 16, MASKS["decode"], seed=18,
                                              device=target.device, fp8_dtype=kernel.fp8_dtype)
    eager = kernel(x, scale, masked_m, prepared, expected_rows=2, check=False)
    graph_out = poison(torch.empty_like(eager))
    kernel(x, scale, masked_m, prepared, expected_rows=2, out=graph_out, check=False)  # compile first
    graph_out = poison(graph_out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(x, scale, masked_m, prepared, expected_rows=2, out=graph_out, check=False)
    graph.replay()
    torch.cuda.synchronize()
    for e, m in enumerate(MASKS["decode"]):
        assert torch.equal(graph_out[e, :m].view(torch.int16), eager[e, :m].view(torch.int16))
        assert bool(is_poison(graph_out[e, m:]).all())


@pytest.mark.parametrize("scales", ["tiny", "unfoldable"])
def test_folded_path_scales(target, scales):
    """The folded path (48 expected rows on sm_90) with weight scales near 2^-20, which need the
    power-of-two shift to fold into normal fp16, and with one scale 2^-28 below the rest, which
    cannot fold: those weights take the per-group tile. Both feeds against the oracle."""
    spec = spec_of(4, hidden_size=2048, intermediate_size=512)
    weights = weights_of(spec, target.device, 19)
    if scales == "tiny":
        weights = attrs.evolve(weights, w13_scale=weights.w13_scale * 2.0**-20,
                               w2_scale=weights.w2_scale * 2.0**-20)
    else:
        w2_scale = weights.w2_scale.clone()
        w2_scale.view(-1)[0] = w2_scale.view(-1)[1] * 2.0**-28
        weights = attrs.evolve(weights, w2_scale=w2_scale)
    kernel = kernels(spec, target)["requant"]
    prepared = kernel.prepare_weights(weights)
    assert prepared.data.foldable == (scales == "tiny")
    run_both(spec, target, [60, 3, 0, 48], 60, 48, seed=19, weights=weights)  # inputs of seed 20
    path = kernel._launch(60, 48, prepared.data.foldable)[0].path
    folds = scales == "tiny" and target.gpu.features.wgmma  # the folded path is for sm_90's wgmma
    assert path == ("folded" if folds else "decode")


def test_folded_path_replays_in_a_cuda_graph(target):
    """The folded path's three launches (w4afp8's requant to fp16, both GEMMs) captured."""
    if not target.gpu.features.wgmma:
        pytest.skip("the folded path runs on GPUs with wgmma (sm_90)")
    spec = spec_of(8)
    kernel = kernels(spec, target)["requant"]
    assert kernel.plan(expected_rows=40, max_m=64).tile.path == "folded"
    prepared = kernel.prepare_weights(weights_of(spec, target.device, 21))
    counts = [33, 30, 0, 32, 12, 64, 31, 29]
    x, scale, masked_m = random_masked_inputs(8, spec.hidden_size, 64, counts, seed=22,
                                              device=target.device, fp8_dtype=kernel.fp8_dtype)
    eager = kernel(x, scale, masked_m, prepared, expected_rows=40, check=False)
    graph_out = poison(torch.empty_like(eager))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(x, scale, masked_m, prepared, expected_rows=40, out=graph_out, check=False)
    graph.replay()
    torch.cuda.synchronize()
    for e, m in enumerate(counts):
        assert torch.equal(graph_out[e, :m].view(torch.int16), eager[e, :m].view(torch.int16))
        assert bool(is_poison(graph_out[e, m:]).all())
