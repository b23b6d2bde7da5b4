"""`hal doctor`: every piece checked in one place, what a missing one costs, and exit 0 unless an
essential piece is missing."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.cpu


def doctor(*args, **env):
    return subprocess.run([sys.executable, "-m", "hal", "doctor", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})


def test_the_report_names_every_check_and_exits_zero_when_nothing_essential_is_missing(tmp_path):
    run = doctor(HAL_CACHE_DIR=str(tmp_path / "cache"))
    assert run.returncode == 0, run.stdout + run.stderr
    for name in ("torch", "GPUs", "C++ compiler", "nvcc", "triton", "kernel cache", "AMX", "backends"):
        assert f"  {name} " in run.stdout
    assert f"torch {torch.__version__}" in run.stdout
    assert str(tmp_path / "cache") in run.stdout and "nothing essential is missing" in run.stdout
    if not torch.cuda.is_available():
        assert "costs: marlin, triton_moe, requant and w4afp8 run on GPUs only" in run.stdout


def test_a_missing_compiler_says_what_it_costs(tmp_path):
    run = doctor("--json", CXX=str(tmp_path / "no-such-compiler"), HAL_CACHE_DIR=str(tmp_path / "c"))
    assert run.returncode == 0, run.stderr
    cxx = next(c for c in json.loads(run.stdout) if c["name"] == "C++ compiler")
    assert cxx["ok"] is False and not cxx["essential"] and "cpu_brgemm" in cxx["cost"]


def test_an_unwritable_kernel_cache_is_essential(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = doctor(HAL_CACHE_DIR=str(blocker / "cache"))
    assert run.returncode == 1
    line = next(x for x in run.stdout.splitlines() if "kernel cache" in x)
    assert line.split()[0] == "FAIL" and "is not a writable directory" in line
    assert "essential piece(s) missing: kernel cache" in run.stdout
