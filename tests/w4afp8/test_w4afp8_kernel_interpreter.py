"""The w4afp8 Triton kernels in Triton's interpreter on CPU, against the float64 oracle
(hal.backends.reference.ops). The MMA runs in fp32 here (the interpreter has no FP8 MMA) on the same
FP8 and int4 values; tiny shapes, because the interpreter runs every program in numpy."""

from __future__ import annotations

import attrs
import pytest
import torch
from hal.backends.reference import dequant, ops

from hal.backend import Target
from hal.caps import Caps
from hal.spec import MoESpec
from hal.synth import random_masked_inputs, random_weights
from hal.testing import ACCURACY, is_poison, poison, rel_err

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("interpreter")]

E, H, I = 4, 256, 128
MASKS = {
    "ragged": [3, 0, 7, 1],
    "all_empty": [0, 0, 0, 0],
    "full": [7, 7, 7, 7],
    "one_expert_takes_all": [0, 7, 0, 0],
}
CPU = Target("cpu", Caps())


def spec_of(activation="silu", hidden=H, inter=I, experts=E):
    return MoESpec(num_experts=experts, top_k=1, hidden_size=hidden, intermediate_size=inter,
                   weight_format="w4afp8", layout="masked", activation=activation)


def build(spec, variant="fused"):
    from hal.backends.w4afp8.kernel import W4AFp8MaskedKernel

    return W4AFp8MaskedKernel(spec, CPU, variant)


def oracle(spec, x, scale, masked_m, weights):
    out = torch.zeros(x.shape, dtype=torch.float64)
    return ops.moe_masked(spec, x, scale, masked_m, weights, out, compute_dtype=torch.float64)


def check_live_rows(out, ref, masked_m):
    """Every live row close to the oracle, every dead row still poison."""
    for e, m in enumerate(masked_m.tolist()):
        assert bool(is_poison(out[e, m:]).all()), f"expert {e}: a row >= masked_m was written"
        if m:
            assert not bool(is_poison(out[e, :m]).any()), f"expert {e}: a live row was not written"
            err = rel_err(out[e, :m], ref[e, :m])
            assert err <= ACCURACY, f"expert {e}: rel err {err:.2e}"


def fp8_order(t: torch.Tensor) -> torch.Tensor:
    """FP8 codes (sign-magnitude) as ordered integers: adjacent representable values differ by 1."""
    bits = t.view(torch.uint8).to(torch.int32)
    magnitude = bits & 0x7F
    return torch.where(bits >= 0x80, -magnitude, magnitude)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("layout", ["column", "row"])
def test_both_feeds_match_the_oracle_and_each_other(mask, layout):
    spec = spec_of()
    weights = random_weights(spec, seed=3)
    x, scale, masked_m = random_masked_inputs(E, H, 7, MASKS[mask], seed=len(mask), scale_layout=layout)
    ref = oracle(spec, x, scale, masked_m, weights)
    outs = {}
    for variant in ("fused", "requant"):
        kernel = build(spec, variant)
        out = poison(torch.empty(x.shape, dtype=torch.bfloat16))
        kernel(x, scale, masked_m, kernel.prepare_weights(weights), expected_rows=3, out=out)
        check_live_rows(out, ref, masked_m)
        outs[variant] = out
    # The same rounding point in registers as in the requant op: the same bytes.
    assert torch.equal(outs["fused"].view(torch.int16), outs["requant"].view(torch.int16))


@pytest.mark.parametrize("activation", ["swiglu_oai", "relu2"])
def test_other_activations(activation):
    spec = spec_of(activation)
    weights = random_weights(spec, seed=5)
    x, scale, masked_m = random_masked_inputs(E, H, 5, [5, 2, 0, 4], seed=6)
    kernel = build(spec)
    out = poison(torch.empty(x.shape, dtype=torch.bfloat16))
    kernel(x, scale, masked_m, kernel.prepare_weights(weights), out=out)
    check_live_rows(out, oracle(spec, x, scale, masked_m, weights), masked_m)


def test_rows_beyond_the_m_grid_are_walked_by_the_same_programs():
    """expected_rows=1 sizes one 8-row m-program per expert; 40 rows need five m-blocks, and an
    odd max_m leaves a partial last block."""
    spec = spec_of(experts=2)
    weights = random_weights(spec, seed=8)
    x, scale, masked_m = random_masked_inputs(2, H, 41, [40, 17], seed=9)
    kernel = build(spec)
    plan = kernel.plan(masked_m, expected_rows=1, max_m=41)
    assert plan.m_programs == 1 and plan.tile.block_m == 8
    out = poison(torch.empty(x.shape, dtype=torch.bfloat16))
    kernel(x, scale, masked_m, kernel.prepare_weights(weights), expected_rows=1, out=out)
    check_live_rows(out, oracle(spec, x, scale, masked_m, weights), masked_m)


def test_planes_tile_of_32_rows():
    """The rule's planes tile at 17-32 rows (32 x 32, two warps): an expert with 40 rows walks a
    second m-block, partial ones and an empty expert stay exact."""
    spec = spec_of()
    weights = random_weights(spec, seed=13)
    x, scale, masked_m = random_masked_inputs(E, H, 41, [40, 0, 17, 32], seed=14)
    kernel = build(spec)
    tile = kernel.plan(masked_m, expected_rows=24, max_m=41).tile
    assert (tile.path, tile.block_m, tile.block_n, tile.num_warps) == ("planes", 32, 32, 2)
    out = poison(torch.empty(x.shape, dtype=torch.bfloat16))
    kernel(x, scale, masked_m, kernel.prepare_weights(weights), expected_rows=24, out=out)
    check_live_rows(out, oracle(spec, x, scale, masked_m, weights), masked_m)


def test_masked_m_above_max_m_stays_inside_the_buffer_without_check():
    """check=False: a masked_m past max_m must not read or write another expert's rows."""
    spec = spec_of(experts=2)
    weights = random_weights(spec, seed=10)
    x, scale, _ = random_masked_inputs(2, H, 3, [3, 3], seed=11)
    kernel = build(spec)
    out = poison(torch.empty(x.shape, dtype=torch.bfloat16))
    bad = torch.tensor([1000, 0], dtype=torch.int32)
    kernel(x, scale, bad, kernel.prepare_weights(weights), out=out, check=False)
    assert not bool(is_poison(out[0]).any()) and bool(is_poison(out[1]).all())


def _int4_weights(spec, seed):
    weights = random_weights(spec, seed=seed)
    from hal.backends.w4afp8 import layer

    return weights, layer.prepare(spec, weights, torch.device("cpu"))


# (path, K splits): the FP8 GEMM, the transposed GEMM whole and split over 2 and 4 programs, with
# the scales per group and folded into the weights
PATHS = [("fp8", 1), ("decode", 1), ("decode", 2), ("decode", 4), ("folded", 1), ("folded", 2),
         ("planes", 1), ("planes", 3), ("planes", 4)]
# the folded path reads x and h as fp16 holding FP8 values
VALUES = {"folded": torch.float16}


@pytest.mark.parametrize("path,split_k", PATHS)
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_gemm2_unpacks_nibbles_and_scales_each_group(fp8, path, split_k):
    """GEMM 2 alone has one rounding, the bf16 store: on random FP8 inputs it must equal the
    float64 product on the dequantized int4 weights to bf16 precision, element by element. A
    nibble out of order, a scale on the wrong group or a K split summed twice is far off.
    Expert 0's 21 rows span two 16-row m-blocks walked by one m-program: K is split on the first
    only."""
    from hal.backends.w4afp8 import configs, layer

    spec = spec_of(inter=512)
    weights, data = _int4_weights(spec, seed=12)
    counts = [21, 0, 2, 5]
    limit = torch.finfo(fp8).max
    g = torch.Generator().manual_seed(17)  # the same inputs whichever tests ran before
    h = (torch.randn(E, 21, spec.intermediate_size, generator=g) * 60).clamp(-limit, limit).to(fp8)
    masked_m = torch.tensor(counts, dtype=torch.int32)
    out = poison(torch.empty(E, 21, H, dtype=torch.bfloat16))
    tile = configs.GemmTile(16, 64, 4, 2, path)
    layer.gemm2(spec, h.to(VALUES.get(path, fp8)), masked_m, data, out, tile, 1, torch.float32,
                split_k=split_k)
    w2 = dequant.w2(spec, weights, torch.float64)
    a2 = float(weights.w2_input_scale)
    for e, m in enumerate(counts):
        want = (h[e, :m].double() * a2) @ w2[e].T
        # one bf16 ulp: the interpreter's bf16 store truncates, so a sum an fp32 rounding below a
        # bf16 value lands a full ulp (plus that rounding) under the float64 product
        ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(1e-30))) - 7)
        assert bool(((out[e, :m].double() - want).abs() <= ulp * (1 + 2**-16)).all())
        assert bool(is_poison(out[e, m:]).all())


@pytest.mark.parametrize("path,split_k", PATHS)
def test_gemm1_writes_the_contracts_fp8_within_one_step(path, split_k):
    """GEMM 1's FP8 output against the oracle's GEMM 1 + activation + requant: the fp32 kernel and
    the float64 oracle may round an activation onto neighbouring FP8 values, never further apart.
    Expert 0's 20 rows span two m-blocks of one m-program (K split on the first only)."""
    from hal.backends.w4afp8 import configs, layer

    spec = spec_of(hidden=512)
    weights, data = _int4_weights(spec, seed=13)
    counts = [20, 1, 0, 3]
    x, scale, masked_m = random_masked_inputs(E, 512, 20, counts, seed=14)
    h = poison(torch.empty(E, 20, I, dtype=VALUES.get(path, x.dtype)))
    tile = configs.GemmTile(16, 64, 4, 2, path)
    layer.gemm1(spec, x, scale, masked_m, data, h, tile, 1, torch.float32, split_k=split_k,
                fp8_dtype=x.dtype)
    xq = ops.requant_fp8(x, scale, masked_m, weights.w13_input_scale, torch.empty_like(x))
    a13, a2 = weights.w13_input_scale.double(), weights.w2_input_scale.float()
    w13 = dequant.w13(spec, weights, torch.float64)
    for e, m in enumerate(counts):
        assert bool(is_poison(h[e, m:]).all())
        if not m:
            continue
        live = h[e, :m]
        if live.dtype != x.dtype:  # FP8 values held in fp16: exactly so
            assert torch.equal(live.to(x.dtype).to(live.dtype), live)
            live = live.to(x.dtype)
        act = ops.activation.apply(spec, (xq[e, :m].double() * a13) @ w13[e].T).float()
        steps = (fp8_order(live) - fp8_order(ops.quantize_fp8(act, 1.0 / a2, x.dtype))).abs()
        assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) < 0.05


def test_in_register_requant_rounds_like_torch():
    """The fused feed's rounding point against the requant op's torch contract, on values that
    saturate (|x * s| up to ~ 9 with s13 = 2 / 448) and values near FP8 boundaries."""
    from hal.backends.w4afp8 import configs, layer

    spec = spec_of(activation="relu2", experts=2)
    weights, data = _int4_weights(spec, seed=15)
    x, scale, masked_m = random_masked_inputs(2, H, 4, [4, 4], seed=16)
    small = torch.tensor([2.0 / 448])
    fused, requant = (poison(torch.empty(2, 4, I, dtype=x.dtype)) for _ in range(2))
    tile = configs.gemm_tile(4, None)
    data = attrs.evolve(data, w13_input_scale=small)
    layer.gemm1(spec, x, scale, masked_m, data, fused, tile, 1, torch.float32)
    xq = ops.requant_fp8(x, scale, masked_m, small, torch.empty_like(x))
    assert float(xq.float().abs().max()) == 448.0, "expected some values to saturate"
    layer.gemm1(spec, xq, None, masked_m, data, requant, tile, 1, torch.float32)
    assert torch.equal(fused.view(torch.uint8), requant.view(torch.uint8))


def test_fold_shift_keeps_every_folded_weight_an_exact_fp16():
    """The power of two puts every nonzero scale in [2^-14, 2^12] (so (q - 8) * s * 2^c is a normal
    fp16 below 2^15 with at most 11 significant bits); scales spanning more than that cannot fold."""
    from hal.backends.w4afp8 import layer

    uniform = torch.rand(64, generator=torch.Generator().manual_seed(1))
    for top in (3e-3, 1.0, 7e4, 2.0**-30):
        scales = (uniform * top + top / 8).to(torch.bfloat16)
        shift = layer.fold_shift(scales)
        assert shift is not None and shift == 2.0 ** round(torch.log2(torch.tensor(shift)).item())
        folded = scales.double() * shift
        assert float(folded.max()) <= layer.FOLDED_SCALE_MAX and float(folded.min()) >= layer.FP16_MIN_NORMAL
        # every (q - 8) * s * 2^c survives fp16 unchanged
        q = torch.arange(-8, 8, dtype=torch.float64)
        products = (q[:, None] * folded[None, :]).flatten()
        assert torch.equal(products.to(torch.float16).double(), products)
    assert layer.fold_shift(torch.tensor([1.0, 2.0**-28], dtype=torch.bfloat16)) is None
    assert layer.fold_shift(torch.tensor([1.0, float("inf")], dtype=torch.bfloat16)) is None
    assert layer.fold_shift(torch.zeros(4, dtype=torch.bfloat16)) == 1.0


@pytest.mark.parametrize("magnitude", [1.0, 2.0**-20])
def test_folded_layer_both_feeds_match_the_oracle_and_each_other(magnitude):
    """The folded path whole: w4afp8's requant launch writing fp16 (or the fused feed), GEMM 1 with
    the scales folded into fp16 weights, h in fp16, GEMM 2, against the float64 oracle; weight
    scales near 2^-20 need the power-of-two shift to stay normal fp16."""
    from hal.backends.w4afp8 import configs, layer

    spec = spec_of()
    weights = random_weights(spec, seed=21)
    weights = attrs.evolve(weights, w13_scale=weights.w13_scale * magnitude,
                           w2_scale=weights.w2_scale * magnitude)
    data = layer.prepare(spec, weights, torch.device("cpu"))
    assert data.foldable
    counts = [20, 0, 3, 7]
    x, scale, masked_m = random_masked_inputs(E, H, 20, counts, seed=22)
    ref = oracle(spec, x, scale, masked_m, weights)
    tile = configs.GemmTile(16, 64, 4, 2, "folded")
    x16 = poison(torch.empty(x.shape, dtype=torch.float16))
    layer.requant_to_f16(x, scale, masked_m, data, x16)
    xq = ops.requant_fp8(x, scale, masked_m, weights.w13_input_scale, torch.empty_like(x))
    for e, m in enumerate(counts):
        assert torch.equal(x16[e, :m], xq[e, :m].to(torch.float16)) and bool(is_poison(x16[e, m:]).all())
    outs = {}
    for feed, (a, a_scale) in {"requant": (x16, None), "fused": (x, scale)}.items():
        h = poison(torch.empty(E, 20, I, dtype=torch.float16))
        layer.gemm1(spec, a, a_scale, masked_m, data, h, tile, 1, torch.float32, split_k=2,
                    fp8_dtype=x.dtype)
        out = poison(torch.empty(x.shape, dtype=torch.bfloat16))
        layer.gemm2(spec, h, masked_m, data, out, tile, 1, torch.float32)
        check_live_rows(out, ref, masked_m)
        outs[feed] = out
    assert torch.equal(outs["fused"].view(torch.int16), outs["requant"].view(torch.int16))
