"""moe-hal's backends import as `hal.backends`, so a user's own `backends` package in the working
directory shadows none of them (the wheel test repeats this with a `hal` folder beside it)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cpu

SELECT = ("import hal; "
          "spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64); "
          "print(hal.select_moe_kernel(spec, 'cpu', prefer='reference').backend)")


def test_a_users_backends_package_in_the_working_directory_shadows_nothing(tmp_path):
    (tmp_path / "backends" / "reference").mkdir(parents=True)
    (tmp_path / "backends" / "__init__.py").write_text("raise ImportError('the user's own backends')\n")
    (tmp_path / "backends" / "reference" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", SELECT], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "reference"


def test_entry_points_name_the_unique_import_path():
    from importlib import metadata

    values = {ep.name: ep.value for ep in metadata.entry_points(group="hal.backends")}
    assert values and all(v.startswith("hal.backends.") for v in values.values()), values
