"""compute-sanitizer memcheck over selected GPU tests: each selection is re-run in a child pytest
under `compute-sanitizer --tool memcheck`, so an out-of-bounds read or write, or a misaligned
access, fails here even where the output happened to be right. Runs in `tox -e cuda`; skipped with
the reason where there is no GPU or no compute-sanitizer."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cuda, pytest.mark.sanitizer]

ROOT = Path(__file__).resolve().parents[2]
# (test file, -k expression): cases that cover every kernel path (both requant phases, masked rows,
# column-major scales; Marlin EP + bias, split K, skewed routing; triton_moe's w8a8 and w8a8x2
# quantization launch and GEMM 1's e4m3 epilogue (one and two terms), repacked mxfp4 in both operand
# orders, int4 repacked (bf16 and fp16) and on its checkpoint layout, w8a16's swap-AB GEMM 1 at
# prefill, the K split at decode; w4afp8's planes GEMMs with K split and on 32-row tiles, a hot
# expert walking several m-blocks, both feeds, and a masked_m above max_m, the folded GEMMs and their
# fp16 requant launch, and the per-group GEMMs they fall back to) at sizes memcheck gets through in
# minutes. The Marlin file's own memcheck case is left out: it runs compute-sanitizer itself.
SELECTED = (
    ("tests/requant/test_kernel_cuda.py", "1152 or many_experts or hints"),
    ("tests/marlin/test_marlin_cuda.py", "skewed_routings or baselines_are_correct or expert_map"),
    ("tests/triton_moe/test_triton_moe_kernel_cuda.py",
     "w8a8 or (mxfp4_paths and repacked) or (per_route_blocks and mxfp4) or (token_counts and 700 and fp8) "
     "or int4_paths or int4_per_channel or split_k"),
    ("tests/w4afp8/test_w4afp8_kernel_cuda.py",
     "many_local or masked_m_above or (every_tile and 1) or (every_tile and 24) or folded_path_scales"),
)


def compute_sanitizer():
    tool = os.environ.get("COMPUTE_SANITIZER") or shutil.which("compute-sanitizer")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        candidate = Path(home, "bin", "compute-sanitizer") if home else None
        if tool is None and candidate is not None and candidate.exists():
            tool = str(candidate)
    return tool


@pytest.mark.parametrize("path, select", SELECTED, ids=[Path(p).parent.name for p, _ in SELECTED])
def test_gpu_tests_are_memcheck_clean(path, select):
    tool = compute_sanitizer()
    if tool is None:
        pytest.skip("compute-sanitizer not found (looked at COMPUTE_SANITIZER, PATH, CUDA_HOME/bin and "
                    "/usr/local/cuda/bin)")
    run = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-m", "pytest",
                          "-q", "-p", "no:cacheprovider", "-m", "cuda and not sanitizer", "-k", select, path],
                         cwd=ROOT, capture_output=True, text=True, timeout=3600)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    assert "ERROR SUMMARY: 0 errors" in run.stdout + run.stderr, tail
    assert " passed" in run.stdout, tail
