"""The w4afp8 backend's verdicts, ranks, selection on recorded profiles, plans and validation
(CPU; nothing here launches a kernel)."""

from __future__ import annotations

import attrs
import pytest
import torch
from hal.backends.reference import backend as reference
from hal.backends.requant import backend as requant
from hal.backends.w4afp8 import backend

import hal
from hal.backend import Target
from hal.caps import Caps, GpuCaps, GpuFeatures
from hal.spec import MoESpec, RequantSpec

pytestmark = pytest.mark.cpu

SPEC = MoESpec(num_experts=256, top_k=8, hidden_size=7168, intermediate_size=2048, num_local_experts=8,
               weight_format="w4afp8", layout="masked")
A100 = GpuCaps(index=0, vendor="nvidia", name="NVIDIA A100", arch="sm_80", warp_size=32,
               features=GpuFeatures(mma_sync=True, cp_async=True))
L40S = GpuCaps(index=0, vendor="nvidia", name="NVIDIA L40S", arch="sm_89", warp_size=32,
               features=GpuFeatures(mma_sync=True, cp_async=True, fp8="ocp"))


def profile_target(profile: str, device="cuda:0") -> Target:
    if profile not in hal.profiles():
        pytest.skip(f"profile {profile!r} is not recorded")
    return Target(device, hal.probe(profile=profile))


@pytest.mark.profiles
@pytest.mark.parametrize("profile", ["h200", "h100", "mi300x"])
def test_fp8_mma_gpus_accept_and_outrank_the_requant_fallback(profile):
    target = profile_target(profile)
    verdict = backend.check(SPEC, target)
    assert verdict.ok, verdict.reasons
    assert requant.check(SPEC, target).ok
    assert backend.rank(SPEC, target) > requant.rank(SPEC, target) > reference.rank(SPEC, target)
    assert "FP8" in verdict.summary() and "MMA" in verdict.summary()


@pytest.mark.profiles
@pytest.mark.parametrize("profile", ["h200", "h100", "mi300x"])
def test_selection_picks_it_on_fp8_mma_gpus(profile):
    pytest.importorskip("triton")
    target = profile_target(profile)
    kernel = hal.select_moe_kernel(SPEC, "cuda:0", caps=target.caps)
    assert kernel.backend == "w4afp8" and kernel.variant == "requant"
    assert "requant" in kernel.decision.explain()


@pytest.mark.profiles
def test_zen4_cpu_profile_never_selects_it(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    target = profile_target("zen4", device="cpu")
    verdict = backend.check(SPEC, target)
    assert not verdict.ok and "TRITON_INTERPRET=1" in verdict.summary()
    assert hal.select_moe_kernel(SPEC, "cpu", caps=target.caps).backend == "reference"


@pytest.mark.profiles
def test_rdna3_is_rejected_with_every_reason():
    reasons = backend.check(SPEC, profile_target("rx7900xtx")).reasons
    assert any("FP8" in r for r in reasons) and any("MFMA" in r for r in reasons), reasons


def test_collects_every_reason():
    tokens = MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128)
    reasons = backend.check(tokens, Target("cuda:0", Caps(gpus=(A100,)))).reasons
    assert len(reasons) == 4, reasons
    assert "w4afp8" in reasons[0] and "masked" in reasons[1] and "FP8" in reasons[2]
    assert "sm_89" in reasons[3]
    assert not backend.check(RequantSpec(8, 256), Target("cuda:0", Caps(gpus=(L40S,)))).ok
    assert backend.check(SPEC, Target("cuda:0", Caps(gpus=(L40S,)))).ok
    assert not backend.check(SPEC, Target("cuda:1", Caps(gpus=(L40S,)))).ok  # no such GPU
    no_warp = GpuCaps(index=0, vendor="nvidia", arch="sm_90", features=GpuFeatures(fp8="ocp"),
                      unknown={"warp_size": "NVML does not report it"})
    assert "NVML does not report it" in backend.check(SPEC, Target("cuda:0", Caps(gpus=(no_warp,)))).summary()


def test_cpu_needs_the_interpreter_and_is_then_chosen_only_when_named(monkeypatch):
    cpu = Target("cpu", Caps())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not backend.check(SPEC, cpu).ok
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        backend.build(SPEC, cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    verdict = backend.check(SPEC, cpu)
    assert verdict.ok and verdict.explicit_only


@pytest.mark.profiles
def test_plans_say_which_feed_runs_and_why():
    pytest.importorskip("triton")
    target = profile_target("h200")
    kernel = backend.build(SPEC, target)
    masked_m = torch.tensor([1, 0, 3, 2, 0, 1, 1, 0], dtype=torch.int32)
    plan = kernel.plan(masked_m, expected_rows=2, max_m=128)
    text = plan.describe()
    assert plan.variant == "requant" and "default" in text and "requant op rewrites x" in text
    assert "requant tuned" in text
    # a few rows: the planes path, 8 rows on the N side of one warp's fp16 mma.sync
    assert plan.tile.path == "planes" and "planes path" in text
    assert (plan.tile.block_m, plan.tile.block_n, plan.tile.num_warps) == (8, 32, 1)
    assert (plan.m_programs, plan.gemm1_n_blocks, plan.gemm2_n_blocks) == (1, 64, 224)
    assert plan.mma_dtype == "float16" and plan.rows == 8 and plan.live_experts == 5
    # 8 experts x 64 n-blocks fill half of 8 one-warp programs on each of 132 SMs: GEMM 1 splits
    # K in 2
    assert plan.split_k == (2, 1) and "2 K splits" in text
    assert plan.programs == 1 * (64 * 2 + 224) * 8
    # a small grid splits further, each split keeping 4 groups of 128 at least
    assert backend.build(attrs.evolve(SPEC, num_local_experts=1), target).plan(
        expected_rows=2, max_m=128).split_k == (8, 4)
    # 32 experts fill the GPU without a split
    wide = backend.build(attrs.evolve(SPEC, num_local_experts=32), target).plan(expected_rows=2, max_m=128)
    assert (wide.tile.path, wide.tile.block_m, wide.split_k) == ("planes", 8, (1, 1))
    # the planes grid has no slack: one m-program per 8 expected rows, further rows walked in a loop
    assert kernel.plan(expected_rows=8, max_m=128).m_programs == 1
    assert kernel.plan(expected_rows=9, max_m=128).m_programs == 1  # the 16-row tile
    assert kernel.plan(expected_rows=8, max_m=128).split_k == (2, 1)
    sixteen = kernel.plan(expected_rows=16, max_m=128)
    assert (sixteen.tile.block_m, sixteen.tile.block_n, sixteen.tile.num_warps) == (16, 64, 2)
    assert sixteen.split_k == (2, 1)  # 256 two-warp programs of GEMM 1 fill half of 4 per SM
    baseline = kernel.baselines()["fused"]
    assert baseline.variant == "fused" and set(baseline.baselines()) == {"requant", "per_group", "rows_on_m"}
    fused_text = baseline.plan(masked_m, expected_rows=2, max_m=128).describe()
    assert "in registers" in fused_text and "baseline" in fused_text
    # 17-32 rows: planes on a 32 x 32 tile of two warps; from 33 the weight scales are folded into
    # fp16 weights, and w4afp8's own launch feeds GEMM 1 fp16 (the requant op's plan is not part of it)
    mid = kernel.plan(expected_rows=24, max_m=128)
    assert (mid.tile.path, mid.tile.block_m, mid.tile.block_n, mid.tile.num_warps) == ("planes", 32, 32, 2)
    assert "requant tuned" in mid.describe()
    folded = kernel.plan(expected_rows=48, max_m=128)
    assert (folded.tile.path, folded.tile.block_m, folded.mma_dtype) == ("folded", 64, "float16")
    folded_text = folded.describe()
    assert "folded" in folded_text and "written as fp16" in folded_text and "requant tuned" not in folded_text
    assert kernel.plan(expected_rows=64, max_m=128).tile.block_m == 64  # the tile fits the estimate
    prefill = kernel.plan(expected_rows=256, max_m=512)
    assert (prefill.tile.block_m, prefill.tile.block_n, prefill.tile.num_warps, prefill.m_programs) == \
        (128, 128, 8, 4)
    assert prefill.tile.path == "folded" and prefill.mma_dtype == "float16"
    assert prefill.split_k == (1, 1)
    # the per-group rule (the folded path's baseline): bf16 MMA up to 64 rows, FP8 beyond
    per_group = kernel.baselines()["per_group"]
    assert per_group.plan(expected_rows=48, max_m=128).tile.path == "decode"
    assert per_group.plan(expected_rows=65, max_m=128).tile.path == "transposed_fp8"
    pg_prefill = per_group.plan(expected_rows=256, max_m=512)
    assert (pg_prefill.tile.path, pg_prefill.mma_dtype) == ("transposed_fp8", "float8_e4m3fn")
    assert "per K group" in pg_prefill.describe()
    # weights whose scales cannot be folded take the per-group tile
    assert kernel._launch(512, 256, foldable=False)[0] == pg_prefill.tile
    assert kernel.plan(max_m=48).m_programs == 1  # no estimate: sized for max_m
    # the previous tiles, kept as the baseline: rows on the FP8 MMA's M side, never below a
    # warpgroup MMA's 64 rows on sm_90, so the MMA stays FP8
    rows_on_m = kernel.baselines()["rows_on_m"]
    old = rows_on_m.plan(masked_m, expected_rows=2, max_m=128)
    assert (old.tile.path, old.tile.block_m, old.split_k) == ("fp8", 64, (1, 1))
    assert old.mma_dtype == "float8_e4m3fn"
    assert "rows_on_m" in old.describe() and "baseline" in old.describe()
    old_prefill = rows_on_m.plan(expected_rows=256, max_m=512)
    assert (old_prefill.tile.block_m, old_prefill.tile.num_warps, old_prefill.m_programs) == (128, 8, 4)
    mi300x_kernel = backend.build(SPEC, profile_target("mi300x"))
    mi300x = mi300x_kernel.plan(masked_m, expected_rows=2)
    # the planes path on gfx942: fp16 MFMA, never below its 16-row N side, two stages
    assert mi300x.mma_dtype == "float16" and mi300x.tile.num_stages == 2
    assert (mi300x.tile.path, mi300x.tile.block_m) == ("planes", 16)
    mi300x_prefill = mi300x_kernel.plan(expected_rows=256, max_m=512)
    assert mi300x_prefill.mma_dtype == "float8_e4m3fnuz" and mi300x_prefill.tile.num_stages == 2
    l40s = backend.build(SPEC, Target("cuda:0", Caps(gpus=(L40S,)))).baselines()["rows_on_m"]
    assert l40s.plan(expected_rows=2, max_m=128).tile.block_m == 16  # sm_89: FP8 mma.sync at M = 16
    with pytest.raises(ValueError, match="rule='fast'"):
        type(kernel)(SPEC, target, rule="fast")


def test_bad_arguments_name_what_is_wrong():
    pytest.importorskip("triton")
    from hal.backends.w4afp8.kernel import W4AFp8MaskedKernel

    from hal.synth import random_masked_inputs, random_weights

    with pytest.raises(ValueError, match="variant='fast'"):
        W4AFp8MaskedKernel(SPEC, Target("cuda:0", Caps(gpus=(L40S,))), "fast")
    spec = MoESpec(num_experts=2, top_k=1, hidden_size=256, intermediate_size=128,
                   weight_format="w4afp8", layout="masked")
    kernel = W4AFp8MaskedKernel(spec, Target("cpu", Caps()))
    weights = random_weights(spec, seed=1)
    for name in ("w13_input_scale", "w2_input_scale"):
        for value in (0.0, float("inf")):
            bad = attrs.evolve(weights, **{name: torch.tensor(value)})
            with pytest.raises(ValueError, match=name):
                kernel.prepare_weights(bad)
    prepared = kernel.prepare_weights(weights)
    x, scale, masked_m = random_masked_inputs(2, 256, 3, [3, 1], fp8_dtype=torch.float8_e4m3fnuz)
    with pytest.raises(ValueError, match="x has dtype"):
        kernel(x, scale, masked_m, prepared)
    x, scale, masked_m = random_masked_inputs(2, 256, 3, [3, 1])
    with pytest.raises(ValueError, match="masked_m"):
        kernel(x, scale, torch.tensor([4, 1], dtype=torch.int32), prepared)
    with pytest.raises(ValueError, match="out must be"):
        kernel(x, scale, masked_m, prepared, out=torch.empty(2, 3, 256))
