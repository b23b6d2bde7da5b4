"""The w4afp8 kernels compiled ahead of time for sm_90, sm_89 and gfx942 on any machine (Triton
compiles without the GPU): the fp8 path must lower to FP8 matrix instructions, the decode path to
bf16 ones and the planes and folded paths to fp16 ones (with the PTX unpack on NVIDIA only), the
folded path's wgmmas must stay in flight across K groups, and each fits a block's shared memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from hal.testing.triton_aot import compiled_ahead_of_time

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
# bytes: a block's opt-in shared memory on an H100/H200 (227 KB), the most one program may hold
# (the 256-row FP8 prefill tile holds 122 KB; the decode tiles 38-81 KB).
MAX_SHARED = 227 * 1024


def compiled(target: str) -> list:
    return compiled_ahead_of_time(ROOT / "tests/w4afp8/aot_compile.py", target, ROOT)


# path -> the MMA operand type each target's instructions name
OPERANDS = {"planes": ("f16.f16", "f16"), "decode": ("bf16.bf16", "bf16"), "folded": ("f16.f16", "f16"),
            "transposed_fp8": ("e4m3.e4m3", "fp8"), "fp8": ("e4m3.e4m3", "fp8")}


def test_sm90_uses_fp8_wgmma_on_the_fp8_paths_bf16_in_decode_and_fp16_mma_sync_in_planes():
    cases = compiled("cuda:90")
    assert {c["path"] for c in cases} == {"planes", "decode", "folded", "transposed_fp8", "fp8"}
    for case in cases:
        assert case["shared"] <= MAX_SHARED, case
        if case["path"] == "planes":
            # two warps of mma.sync: the unpacked weights stay in the MMA's registers
            assert case["mma"] == ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"], case
            assert case["magic_unpack"] > 0, case
        elif case["path"] == "decode":
            assert any("wgmma" in m and "bf16.bf16" in m for m in case["mma"]), case
            assert case["magic_unpack"] > 0, case
            # each group's result is scaled at once: every wait drains the MMAs
            assert case["wgmma_waits"] == [0], case
        elif case["path"] == "folded":
            assert any("wgmma" in m and "f16.f16" in m and "bf16" not in m for m in case["mma"]), case
            assert case["magic_unpack"] > 0, case
            # the scales are in the weights: the loop waits for all but the newest group's MMA
            assert max(case["wgmma_waits"]) >= 1, case
        else:
            assert any("wgmma" in m and "e4m3.e4m3" in m for m in case["mma"]), case


def test_sm89_uses_fp8_mma_sync_on_the_fp8_paths():
    cases = compiled("cuda:89")
    assert "folded" not in {c["path"] for c in cases}  # mma.sync is waited for anyway: per group
    for case in cases:
        assert case["shared"] <= MAX_SHARED, case
        assert any(OPERANDS[case["path"]][0] in m for m in case["mma"]), case


def test_gfx942_uses_mfma_and_no_ptx():
    for case in compiled("hip:gfx942"):
        assert case["shared"] <= MAX_SHARED, case
        assert any("mfma" in m and OPERANDS[case["path"]][1] in m for m in case["mma"]), case
        assert case["magic_unpack"] == 0, case
