"""docs/expert-parallel.md's example runs as the page says: its torchrun command starts two gloo
ranks on CPU, and each rank's output is checked against the float64 oracle."""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from hal.testing import ACCURACY

pytestmark = pytest.mark.cpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "expert-parallel.md"
RUN_TIMEOUT_S = 240  # a guard against a hung rank, far above a run on a loaded 2-core machine
LINE = re.compile(r"rank (\d): ep:(\w+) on experts \[([\d, ]+)\], (\d+) tokens, .*?"
                  r"relative error vs float64: ([\d.e+-]+)")


def page_command() -> list:
    (line,) = [line.strip() for line in PAGE.read_text().splitlines() if line.strip().startswith("torchrun ")]
    args = shlex.split(line)
    return [sys.executable, "-m", "torch.distributed.run", *args[1:]]


def test_the_pages_torchrun_command_runs_two_ranks_within_the_oracle_bound():
    command = page_command()
    assert "--nproc-per-node" in command and command[command.index("--nproc-per-node") + 1] == "2"
    script = ROOT / command[-1]
    assert script.is_file() and script.parent == ROOT / "docs" / "examples"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    ranks = {int(m.group(1)): m for m in LINE.finditer(run.stdout)}
    assert sorted(ranks) == [0, 1], run.stdout
    experts = sorted(int(e) for m in ranks.values() for e in m.group(3).split(","))
    assert experts == list(range(8)), "the two ranks own every expert once"
    for m in ranks.values():
        assert float(m.group(5)) <= ACCURACY, m.group(0)
