"""The w4afp8 kernels compiled ahead of time for sm_90, sm_89 and gfx942 on any machine (Triton
compiles without the GPU): the fp8 path must lower to FP8 matrix instructions, the decode path to
bf16 ones (with the PTX unpack on NVIDIA only), and both fit in shared memory with room for
several programs per SM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
# bytes: at most a third of an H100/H200 SM's 228 KB, so three programs can share one.
MAX_SHARED = 76 * 1024


def compiled(target: str) -> list:
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # the real cause: no Triton, or a module it needs (numpy)
        pytest.skip(f"Triton cannot be imported: {exc}")
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, str(ROOT / "tests/w4afp8/aot_compile.py"), target], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    if done.returncode and ("GPUTarget" in done.stderr or "ASTSource" in done.stderr):
        pytest.skip(f"this Triton cannot compile ahead of time: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sm90_uses_fp8_wgmma_on_the_fp8_path_and_bf16_with_the_ptx_unpack_in_decode():
    cases = compiled("cuda:90")
    assert {c["path"] for c in cases} == {"decode", "fp8"}
    for case in cases:
        assert case["shared"] <= MAX_SHARED, case
        if case["path"] == "fp8":
            assert any("wgmma" in m and "e4m3.e4m3" in m for m in case["mma"]), case
        else:
            assert any("bf16.bf16" in m for m in case["mma"]) and case["magic_unpack"] > 0, case


def test_sm89_uses_fp8_mma_sync_on_the_fp8_path():
    for case in compiled("cuda:89"):
        assert case["shared"] <= MAX_SHARED, case
        want = "e4m3.e4m3" if case["path"] == "fp8" else "bf16.bf16"
        assert any(want in m for m in case["mma"]), case


def test_gfx942_uses_mfma_and_no_ptx():
    for case in compiled("hip:gfx942"):
        assert case["shared"] <= MAX_SHARED, case
        want = "fp8" if case["path"] == "fp8" else "bf16"
        assert any("mfma" in m and want in m for m in case["mma"]), case
        assert case["magic_unpack"] == 0, case
