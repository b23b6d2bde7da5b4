"""check() and rank() read only (spec, caps): no subprocess, no torch or Triton import, no device
context, whether the capabilities are recorded or live. Each test runs in a fresh interpreter, so
nothing imported by other tests hides an import made during selection."""

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.profiles, pytest.mark.cpu]

# Runs in the child before anything else: any subprocess or shell fails loudly.
REFUSE_SUBPROCESSES = """
import os, subprocess, sys
def refuse(*args, **kwargs):
    raise AssertionError(f"a subprocess was started during selection: {args!r}")
subprocess.Popen = refuse
os.system = os.popen = refuse
"""


def run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", REFUSE_SUBPROCESSES + code], capture_output=True,
                          text=True, timeout=300)


def test_every_profile_recorded_or_live_is_decided_without_subprocess_or_torch():
    code = """
import attrs, hal
from hal.matrix import selection_matrix
for name in hal.profiles():
    recorded = hal.probe(profile=name)
    for caps in (recorded, attrs.evolve(recorded, profile=None)):
        for row in selection_matrix(caps):
            assert "check raised" not in row.reason, (name, caps.profile, row)
print(sorted(m for m in ("torch", "triton") if m in sys.modules))
"""
    child = run_child(code)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"


@pytest.mark.parametrize("argv", [
    ("--model", "mixtral-8x7b", "--format", "int4_g128", "--device", "cuda", "--profile", "h200"),
    ("--model", "deepseek-v3", "--format", "w4afp8", "--device", "cuda", "--profile", "mi300x"),
])
def test_hal_select_on_a_profile_decides_before_importing_torch(argv):
    """The CLI imports torch for the plan, after the decision: every decide() it makes runs with
    torch and Triton still unimported and no subprocess started."""
    code = f"""
import runpy
import hal.registry as registry
decide = registry.decide
def checked_decide(*args, **kwargs):
    loaded = [m for m in ("torch", "triton") if m in sys.modules]
    decision = decide(*args, **kwargs)
    loaded += [m for m in ("torch", "triton") if m in sys.modules]
    assert not loaded, f"selection imported {{loaded}}"
    print("decided", decision.op, decision.winner, file=sys.stderr)
    return decision
registry.decide = checked_decide
sys.argv = ["hal", "select", "--tokens", "4", *{argv!r}]
runpy.run_module("hal.cli.main", run_name="__main__")
"""
    child = run_child(code)
    assert child.returncode == 0, child.stdout + child.stderr
    assert "decided" in child.stderr and "WIN" in child.stdout
