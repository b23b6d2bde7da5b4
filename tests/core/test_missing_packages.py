"""A CPU install of moe-hal does not pull triton: the backends that need it say so, and `hal probe`
names what a missing one disables."""

import argparse
import importlib.util

import pytest

from hal.backend import missing_packages
from hal.cli import probe_cmd
from hal.registry import discover

pytestmark = pytest.mark.cpu


class Needs:
    def __init__(self, name, packages):
        self.name, self.packages = name, packages


def test_missing_packages_names_each_backend_that_declared_one():
    backends = [Needs("a", ("no_such_package_for_moe_hal",)), Needs("b", ("torch",)),
                Needs("c", ("no_such_package_for_moe_hal",)), Needs("d", ())]
    assert missing_packages(backends) == {"no_such_package_for_moe_hal": ["a", "c"]}


def test_the_triton_backends_declare_triton():
    declared = {f.name for f in discover() if f.backend and "triton" in getattr(f.backend, "packages", ())}
    assert declared == {"requant", "triton_moe", "w4afp8"}


def test_probe_says_what_a_missing_triton_disables(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    args = argparse.Namespace(json=False, deep=False, profile=None, bandwidth=False, strict=False)
    assert probe_cmd.run(args) == 0
    out = capsys.readouterr().out
    assert "triton is not installed: requant, triton_moe, w4afp8 cannot run here" in out
