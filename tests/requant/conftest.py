"""Fixtures of the requant tests: the Triton interpreter on CPU, and poisoned outputs."""

from __future__ import annotations

import os

import pytest
import torch


def _torch_fp8_downcast(convert_float):
    """Triton's interpreter rounds fp32 -> fp8 half-up and drops the carry into the exponent
    (3.9: 125.8 -> 64 instead of 128), unlike the GPU's cvt.rn.satfinite. Route those casts
    through torch's round-to-nearest-even so interpreter runs test the kernel's indexing, masks
    and arithmetic; the GPU tests check the hardware cast itself."""
    import numpy as np
    import triton.language as tl

    torch_dtypes = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e4b8: torch.float8_e4m3fnuz}

    def convert(values, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype in torch_dtypes:
            fp32 = torch.from_numpy(np.ascontiguousarray(values).view(np.float32))
            return fp8_bits(fp32.to(torch_dtypes[output_dtype])).numpy().reshape(values.shape)
        return convert_float(values, input_dtype, output_dtype, rounding_mode)

    return convert


def fp8_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.fixture(scope="module")
def interpreter():
    """Run backends.requant's Triton kernels in the interpreter on CPU. Triton chooses interpreter
    or compiler for its own library functions (tl.cumsum, tl.sum) when it is first imported, so
    TRITON_INTERPRET=1 must be in the environment before pytest starts (tox -e cpu sets it)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 set before pytest starts (Triton reads it at import)")
    try:
        from triton.runtime import interpreter as triton_interpreter
    except ImportError as exc:  # no Triton, or a module its interpreter needs (numpy) is missing
        pytest.skip(f"Triton's interpreter cannot be imported: {exc}")

    if not hasattr(triton_interpreter, "_convert_float"):
        pytest.skip("this Triton's interpreter has no _convert_float to route fp8 casts through")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_interpreter, "_convert_float",
                      _torch_fp8_downcast(triton_interpreter._convert_float))
        yield


@pytest.fixture
def poisoned():
    """An fp8 tensor of `like`'s shape full of NaN, so rows the kernel must not write stand out
    and rows it must write cannot pass by accident."""

    def make(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.full(like.shape, float("nan"), device=like.device).to(dtype)

    return make
