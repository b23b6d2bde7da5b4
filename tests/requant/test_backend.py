"""The requant backend's verdicts, plans and validation (CPU), and its w4afp8 masked MoE against
the reference backend in Triton's interpreter."""

from __future__ import annotations

import hal.backends.requant as requant
import pytest
import torch
from hal.backends.reference import backend as reference

from hal.backend import RANK_REFERENCE, Target
from hal.caps import Caps, GpuCaps, GpuFeatures
from hal.spec import MoESpec, RequantSpec

pytestmark = pytest.mark.cpu

H200 = GpuCaps(index=0, vendor="nvidia", name="NVIDIA H200", arch="sm_90", warp_size=32, sm_count=132,
               features=GpuFeatures(mma_sync=True, cp_async=True, wgmma=True, tma=True, fp8="ocp"))
MI300X = GpuCaps(index=0, vendor="amd", name="AMD Instinct MI300X", arch="gfx942", warp_size=64,
                 features=GpuFeatures(fp8="fnuz", mfma=True))
A100 = GpuCaps(index=0, vendor="nvidia", name="NVIDIA A100", arch="sm_80", warp_size=32,
               features=GpuFeatures(mma_sync=True, cp_async=True))
W4AFP8 = MoESpec(num_experts=16, top_k=2, hidden_size=256, intermediate_size=128,
                 weight_format="w4afp8", layout="masked")
REQUANT = RequantSpec(num_experts=256, hidden_size=7168)


def gpu_target(gpu: GpuCaps) -> Target:
    return Target("cuda:0", Caps(gpus=(gpu,)))


def test_accepts_fp8_gpus_for_both_ops():
    for gpu in (H200, MI300X):
        for spec in (REQUANT, W4AFP8):
            verdict = requant.backend.check(spec, gpu_target(gpu))
            assert verdict.ok, verdict.reasons
            assert requant.backend.rank(spec, gpu_target(gpu)) > RANK_REFERENCE
    notes = requant.backend.check(W4AFP8, gpu_target(H200)).notes
    assert any("GEMM stages run on backends/reference" in n for n in notes)


def test_collects_every_reason():
    spec = MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128)
    reasons = requant.backend.check(spec, gpu_target(A100)).reasons
    assert len(reasons) == 3, reasons
    assert "w4afp8" in reasons[0] and "FP8" in reasons[1] and "sm_89" in reasons[2]
    no_warp = GpuCaps(index=0, vendor="nvidia", arch="sm_90", features=GpuFeatures(fp8="ocp"),
                      unknown={"warp_size": "NVML does not report it"})
    assert "NVML does not report it" in requant.backend.check(REQUANT, gpu_target(no_warp)).summary()
    assert not requant.backend.check(REQUANT, Target("cuda:1", Caps(gpus=(H200,)))).ok


def test_cpu_needs_the_interpreter_and_then_runs_only_when_named(monkeypatch):
    cpu = Target("cpu", Caps())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    verdict = requant.backend.check(REQUANT, cpu)
    assert not verdict.ok and "TRITON_INTERPRET=1" in verdict.summary()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    verdict = requant.backend.check(REQUANT, cpu)
    assert verdict.ok and verdict.explicit_only
    assert not requant.backend.check(REQUANT, gpu_target(H200)).explicit_only


def test_plans_say_what_they_launch():
    pytest.importorskip("triton")
    kernel = requant.backend.build(REQUANT, gpu_target(H200))
    plan = kernel.plan(max_m=1024, expected_rows=2)
    assert (plan.g_block, plan.m_grid, plan.row_cap, plan.second_phase) == (16, 4, 4, True)
    assert plan.bytes_per_lane == 16 and plan.programs == 4 * 4 * 256
    assert "[16, 128]" in plan.describe() and "second phase" in plan.describe()
    legacy = kernel.baselines()["legacy"]
    assert legacy.variant == "legacy" and legacy.baselines() == {}
    lp = legacy.plan(max_m=1024, expected_rows=2)
    assert (lp.tile_elements, lp.m_grid, lp.num_warps, lp.column_blocks) == (1024, 32, 8, 7)
    assert "legacy" in lp.describe()
    wave64 = requant.backend.build(REQUANT, gpu_target(MI300X)).plan(max_m=1024, expected_rows=2)
    assert wave64.g_block == 32 and wave64.bytes_per_lane == 16
    assert wave64.fp8_dtype == "float8_e4m3fnuz"
    masked_m = torch.tensor([3, 0, 64] + [1] * 13, dtype=torch.int32)
    moe_plan = requant.backend.build(W4AFP8, gpu_target(H200)).plan(masked_m, expected_rows=3)
    assert moe_plan.requant.max_m == 64 and (moe_plan.live_experts, moe_plan.rows) == (15, 80)
    assert "GEMM stages run on backends/reference" in moe_plan.describe()


def test_bad_inputs_name_the_argument():
    pytest.importorskip("triton")
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    from hal.synth import random_masked_inputs

    x, scale, masked_m = random_masked_inputs(2, 256, 4, [4, 1])
    s_out = torch.tensor([0.02])

    def call(**kw):
        args = dict(x=x, x_scale=scale, masked_m=masked_m, output_scale=s_out, gpu=H200)
        args.update(kw)
        return fp8_per_token_to_per_tensor(**args)

    cases = [
        (dict(x=x.float()), "x has dtype"),
        (dict(x=x.to(torch.float8_e4m3fnuz)), "x has dtype"),
        (dict(x=x[:, :, :200].contiguous()), "multiple of 128"),
        (dict(x=x[0]), "x has shape"),
        (dict(x_scale=scale.double()), "x_scale has dtype"),
        (dict(x_scale=scale[:, :, :1]), "x_scale has shape"),
        (dict(masked_m=torch.tensor([5, 1], dtype=torch.int32)), "masked_m holds values"),
        (dict(masked_m=masked_m.long()), "masked_m must be"),
        (dict(output_scale=torch.tensor([0.02, 0.03])), "output_scale must be"),
        (dict(output_scale=torch.tensor([0.02], dtype=torch.float64)), "output_scale must be"),
        (dict(output_scale=torch.tensor([0.0])), "output_scale=0.0"),
        (dict(out=torch.empty(2, 4, 128).to(torch.float8_e4m3fn)), "out must be"),
        (dict(out=torch.empty(x.shape).to(torch.float8_e4m3fnuz)), "out must be"),
        (dict(geometry="fast"), "geometry='fast'"),
        (dict(warp_size=48), "warp_size=48"),
        (dict(expected_rows=-3), "expected_rows=-3"),
        (dict(gpu=A100), "sm_89"),
    ]
    for kw, message in cases:
        with pytest.raises(ValueError, match=message):
            call(**kw)


@pytest.mark.usefixtures("interpreter")
def test_w4afp8_masked_moe_matches_the_reference_backend():
    from hal.synth import random_masked_inputs, random_weights

    cpu = Target("cpu", Caps())
    weights = random_weights(W4AFP8, seed=1)
    mine = requant.backend.build(W4AFP8, cpu)
    ref = reference.build(W4AFP8, cpu)
    for counts in ([0] * 16, [3, 0, 1, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0], [5] * 16):
        x, scale, masked_m = random_masked_inputs(16, 256, 5, counts, seed=sum(counts))
        out = torch.full(x.shape, float("nan"), dtype=torch.bfloat16)
        mine(x, scale, masked_m, mine.prepare_weights(weights), expected_rows=(sum(counts) + 16) // 16,
             out=out)
        want = ref(x, scale, masked_m, ref.prepare_weights(weights))
        for e, m in enumerate(counts):
            assert torch.equal(out[e, :m], want[e, :m])
            assert bool(out[e, m:].isnan().all()), "a row beyond masked_m was written"
