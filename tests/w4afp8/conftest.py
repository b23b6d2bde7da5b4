"""Fixtures of the w4afp8 tests: Triton's interpreter on CPU with torch's FP8 rounding."""

from __future__ import annotations

import pytest

from hal.testing.triton_interpreter import fp8_casts_through_torch


@pytest.fixture(scope="module")
def interpreter():
    """Run the Triton kernels in the interpreter on CPU, fp8 casts rounded by torch."""
    with fp8_casts_through_torch():
        yield
