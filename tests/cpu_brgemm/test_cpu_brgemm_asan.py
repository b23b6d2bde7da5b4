"""cpu_brgemm under AddressSanitizer with routing ids that are not experts and a corrupt
expert_map, check=False: asan_case.py in a subprocess with libasan preloaded (torch itself is not
instrumented, so the runtime must be loaded before it). The first run compiles the ASan build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_brgemm_helpers import runnable_isas

pytestmark = [pytest.mark.cpu, pytest.mark.asan]


def gcc_library(name: str) -> str:
    try:
        path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"gcc not runnable: {exc}")
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip(f"gcc has no {name} (install libasan for gcc)")
    return path


def preload() -> str:
    """libasan first, then libstdc++: the python binary links no C++ runtime, so without it ASan's
    __cxa_throw interceptor finds no real function to call, and the first C++ exception anywhere in
    the process (torch raises and catches one while counting CUDA devices on a GPU host) ends it
    with "CHECK failed: ... real___cxa_throw"."""
    return f"{gcc_library('libasan.so')} {gcc_library('libstdc++.so.6')}"


def test_unchecked_bad_routing_ids_stay_in_bounds():
    if not runnable_isas():
        pytest.skip("this CPU runs neither cpu_brgemm build")
    isa = runnable_isas()[0]  # the ISA changes no routing code; one build keeps the compile short
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, LD_PRELOAD=preload(), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("asan_case.py")), isa],
                         capture_output=True, text=True, timeout=900, env=env)
    tail = (run.stdout + run.stderr)[-6000:]
    assert "ERROR: AddressSanitizer" not in run.stderr, tail
    assert run.returncode == 0, tail
    assert run.stdout.count("rel err") == 6, tail
