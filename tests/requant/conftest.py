"""Fixtures of the requant tests: the Triton interpreter on CPU, and poisoned outputs."""

from __future__ import annotations

import pytest
import torch

from hal.testing.triton_interpreter import fp8_casts_through_torch


@pytest.fixture(scope="module")
def interpreter():
    """Run hal.backends.requant's Triton kernels in the interpreter on CPU, fp8 casts rounded by torch."""
    with fp8_casts_through_torch():
        yield


@pytest.fixture
def poisoned():
    """An fp8 tensor of `like`'s shape full of NaN, so rows the kernel must not write stand out
    and rows it must write cannot pass by accident."""

    def make(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(like.shape, float("nan"), device=like.device).to(dtype)

    return make
