"""The `hal` command where it cannot do what was asked: one line and exit 2, never a traceback;
a reader that leaves early ends it quietly."""

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.cpu


def hal_cli(*args):
    return subprocess.run([sys.executable, "-m", "hal.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_bench_without_the_device_says_so_in_one_line():
    for args in (("bench", "requant"), ("bench", "suite", "marlin"),
                 ("bench", "moe", "--model", "mixtral-8x7b", "--device", "cuda")):
        run = hal_cli(*args)
        assert run.returncode == 2, run.stderr
        assert run.stderr.count("\n") == 1 and "no cuda:0 on this machine" in run.stderr
        assert "Traceback" not in run.stderr


@pytest.mark.parametrize("command", ["probe", "profiles"])
def test_output_into_a_closed_pipe_exits_quietly(command):
    """`hal probe | head`: the reader is gone before the output is written (`profiles` prints less
    than a pipe buffer, so it is written only when the buffer is flushed)."""
    proc = subprocess.Popen([sys.executable, "-m", "hal.cli.main", command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141
    assert err == ""


def test_an_unusable_kernel_cache_is_named_without_a_traceback(tmp_path):
    import os

    from hal.backends.cpu_brgemm.backend import isa_for

    from hal.testing import live_cpu_caps

    if isa_for(live_cpu_caps().cpu) is None:
        pytest.skip("this CPU runs no compiled kernel (neither AVX-512-BF16 nor AVX2+FMA)")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run = subprocess.run([sys.executable, "-m", "hal.cli.main", "build", "--model", "gpt-oss-20b"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HAL_CACHE_DIR": str(blocker / "cache")})
    assert run.returncode == 1
    assert f"HAL_CACHE_DIR={blocker / 'cache'} is not a writable directory" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr
