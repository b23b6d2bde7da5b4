"""The README's example runs as written: it is extracted from README.md and executed, so an API
change that breaks it fails here."""

import pathlib
import re

import pytest

from hal.testing import ACCURACY, rel_err

pytestmark = pytest.mark.cpu

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
SELECTION_VARIABLES = ("HAL_CAPS", "HAL_BACKENDS", "HAL_DISABLE_BACKENDS", "HAL_MOE_BACKEND",
                       "HAL_MOE_MASKED_BACKEND", "HAL_REQUANT_BACKEND")


def python_blocks(text: str) -> list:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_one_python_example():
    assert len(python_blocks(README.read_text())) == 1


def test_readme_example_runs_and_meets_the_accuracy_bound(monkeypatch, capsys):
    # The example selects for this machine as a user would, whatever the test environment forces.
    for name in SELECTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    (code,) = python_blocks(README.read_text())
    namespace = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), namespace)
    out, x = namespace["out"], namespace["x"]
    assert out.shape == x.shape and out.dtype == x.dtype
    assert rel_err(out, namespace["ref"]) <= ACCURACY
    printed = capsys.readouterr().out
    assert "WIN " in printed and "relative error vs float64" in printed
