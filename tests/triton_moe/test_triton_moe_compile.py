"""triton_moe's expert GEMM compiled ahead of time (Triton compiles without the GPU) with the launch
configs the rule picks for recorded profiles of GPUs this machine need not have: AMD CDNA3 and
RDNA3, where no kernel has run on hardware, every format each supports, and the H200, whose
repacked mxfp4 and int4 swap-AB tiles must reach wgmma with their decode's bf16x2 FMAs (inline
PTX, so ptxas must accept it) and no GEMM may have its wgmmas serialized by ptxas, K split or
not. Each must lower to a bf16 matrix instruction of its architecture (the 16-bit dot every
format's weights are dequantized to) and fit its shared memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from hal.testing.triton_aot import compiled_ahead_of_time

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]


def compiled(profile: str) -> list:
    cases = compiled_ahead_of_time(ROOT / "tests/triton_moe/aot_compile.py", profile, ROOT)
    for case in cases:
        assert case["shared"] <= case["smem_limit"], case
    return cases


@pytest.mark.parametrize("profile,instruction,formats", [
    ("mi300x", "v_mfma_f32", {"bf16", "fp8_block128", "int4_g128", "mxfp4"}),
    ("rx7900xtx", "v_wmma_f32", {"bf16", "int4_g128", "mxfp4"}),  # RDNA3 has no fp8
])
def test_amd_lowers_every_format_to_its_bf16_matrix_instruction(profile, instruction, formats):
    cases = compiled(profile)
    assert {c["format"] for c in cases} == formats
    assert {c["tokens"] for c in cases if c["format"] == "mxfp4"} == {1, 512, 4096}
    for case in cases:
        assert [m for m in case["mma"] if m.startswith(instruction) and m.endswith("_bf16")], case


def test_h200_swap_ab_tiles_reach_wgmma():
    cases = compiled("h200")
    assert any(c["swap_ab"] for c in cases)
    # the EP rank at 1 token splits GEMM 1's K, its wgmmas still in flight across K steps
    assert {(c["gemm"], c["split_k"]) for c in cases if c["ep"]} == {(1, 2), (2, 1)}
    assert all(c["pair_fma"] == (c["format"] in ("mxfp4", "int4_g128")) for c in cases)
    assert not [c for c in cases if c["serialized_wgmma"]]
    for case in cases:
        if case["swap_ab"]:
            assert any(m.startswith("wgmma") and "bf16.bf16" in m for m in case["mma"]), case
        else:
            assert any(m.startswith(("mma.sync", "wgmma")) and "bf16.bf16" in m for m in case["mma"]), case
