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


def test_probe_into_a_closed_pipe_exits_quietly():
    """`hal probe | head`: the reader is gone before the table is written."""
    proc = subprocess.Popen([sys.executable, "-m", "hal.cli.main", "probe"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141
    assert err == ""
