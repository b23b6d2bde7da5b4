"""docs/support-matrix.md is what the registry selects today: the page is regenerated from every
backend's check() and rank() on every recorded profile and compared with the committed one."""

import os
import pathlib

import pytest

from hal.matrix import SUPPORT_MATRIX_COMMAND, main, support_matrix_markdown
from hal.registry import discover

pytestmark = [pytest.mark.profiles, pytest.mark.cpu]

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "support-matrix.md"


def test_support_matrix_page_is_current():
    assert PAGE.read_text() == support_matrix_markdown(), \
        f"docs/support-matrix.md is out of date: run `{SUPPORT_MATRIX_COMMAND}` and commit it"


def test_the_command_prints_the_page(capsys):
    assert main(["--markdown"]) == 0
    assert capsys.readouterr().out == support_matrix_markdown()


def test_selection_variables_neither_change_the_page_nor_are_lost(monkeypatch):
    clean = support_matrix_markdown()
    monkeypatch.setenv("HAL_DISABLE_BACKENDS", "triton_moe")
    monkeypatch.setenv("HAL_MOE_BACKEND", "reference")
    assert support_matrix_markdown() == clean
    assert os.environ["HAL_DISABLE_BACKENDS"] == "triton_moe" and os.environ["HAL_MOE_BACKEND"] == "reference"


def test_a_reference_fallback_is_marked_and_a_kernel_is_not():
    page = support_matrix_markdown()
    fp8 = page.split("## fp8_block128")[1].split("## ")[0]
    assert "| a100 | cuda:0 sm_80 | **reference** | **reference** | **reference** |" in fp8
    assert "| h100 | cuda:0 sm_90 | triton_moe | triton_moe | triton_moe |" in fp8
    int4 = page.split("## int4_g128")[1].split("## ")[0]
    assert "| a100 | cuda:0 sm_80 | marlin, then triton_moe |" in int4


def test_with_only_the_reference_registered_every_cell_is_the_marked_fallback():
    only_reference = [d for d in discover() if d.name == "reference"]
    page = support_matrix_markdown(only_reference)
    rows = [line for line in page.splitlines() if line.startswith("| ") and "profile" not in line
            and "---" not in line]
    assert rows and all(cell.strip() == "**reference**" for row in rows for cell in row.split("|")[3:-1])
