"""triton_moe's expert GEMM compiled ahead of time (Triton compiles without the GPU) with the launch
configs the rule picks for recorded profiles of GPUs this machine need not have: AMD CDNA3 and
RDNA3, where no kernel has run on hardware, every format each supports, and the H200, whose
repacked-mxfp4 swap-AB tiles must reach wgmma. Each must lower to a bf16 matrix instruction of its
architecture (the 16-bit dot every format's weights are dequantized to) and fit its shared memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]


def compiled(profile: str) -> list:
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # the real cause: no Triton, or a module it needs (numpy)
        pytest.skip(f"Triton cannot be imported: {exc}")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, str(ROOT / "tests/triton_moe/aot_compile.py"), profile],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode and ("GPUTarget" in done.stderr or "ASTSource" in done.stderr):
        pytest.skip(f"this Triton cannot compile ahead of time: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    cases = json.loads(done.stdout.strip().splitlines()[-1])
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
    assert {c["tokens"] for c in cases if c["format"] == "mxfp4"} == {1, 8, 512, 4096}
    for case in cases:
        assert [m for m in case["mma"] if m.startswith(instruction) and m.endswith("_bf16")], case


def test_h200_swap_ab_tiles_reach_wgmma():
    cases = compiled("h200")
    assert any(c["swap_ab"] for c in cases)
    for case in cases:
        if case["swap_ab"]:
            assert any(m.startswith("wgmma") and "bf16.bf16" in m for m in case["mma"]), case
        else:
            assert any(m.startswith(("mma.sync", "wgmma")) and "bf16.bf16" in m for m in case["mma"]), case
