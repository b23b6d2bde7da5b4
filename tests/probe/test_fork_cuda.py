"""On a CUDA host: after a plain probe, a forked child can still use CUDA.

Runs in a fresh interpreter because any other test in this pytest process may already have initialised CUDA
in the pytest process, which would break the fork whatever the probe did."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cuda
REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import os, sys
from hal.probe import probe
caps = probe()
import torch
probe()  # with torch imported the probe reads its build facts: still no context
assert not torch.cuda.is_initialized(), "plain probe initialised CUDA"
pid = os.fork()
if pid == 0:
    try:
        torch.arange(4, device="cuda").sum().item()
        os._exit(0)
    except BaseException as exc:
        print(f"child: {type(exc).__name__}: {exc}", flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _nvidia_visible() -> bool:
    from hal.probe import probe

    torch = pytest.importorskip("torch")
    return torch.version.cuda is not None and any(g.vendor == "nvidia" for g in probe().gpus)


def test_forked_child_uses_cuda_after_plain_probe():
    if not _nvidia_visible():
        pytest.skip("needs an NVIDIA GPU visible to NVML and a CUDA build of torch")
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
