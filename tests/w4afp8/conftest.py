"""Fixtures of the w4afp8 tests: Triton's interpreter on CPU with torch's FP8 rounding."""

from __future__ import annotations

import os

import pytest
import torch


def _torch_fp8_downcast(convert_float):
    """Triton's interpreter rounds fp32 -> fp8 half-up and drops the carry into the exponent
    (3.9: 125.8 -> 64 instead of 128), unlike the GPU's cvt.rn.satfinite. Route those casts
    through torch's round-to-nearest-even, so interpreter runs test the kernels' unpacking, group
    scales, masks and arithmetic; the GPU tests check the hardware cast itself."""
    import numpy as np
    import triton.language as tl

    torch_dtypes = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e4b8: torch.float8_e4m3fnuz}

    def convert(values, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype in torch_dtypes:
            fp32 = torch.from_numpy(np.ascontiguousarray(values).view(np.float32))
            return fp32.to(torch_dtypes[output_dtype]).view(torch.uint8).numpy().reshape(values.shape)
        return convert_float(values, input_dtype, output_dtype, rounding_mode)

    return convert


@pytest.fixture(scope="module")
def interpreter():
    """Run the Triton kernels in the interpreter on CPU. Triton picks interpreter or compiler when
    it is first imported, so TRITON_INTERPRET=1 must be set before pytest starts (tox -e cpu
    sets it)."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 set before pytest starts (Triton reads it at import)")
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # the real cause: no Triton, or a module it needs (numpy)
        pytest.skip(f"Triton cannot be imported: {exc}")
    from triton.runtime import interpreter as triton_interpreter

    if not hasattr(triton_interpreter, "_convert_float"):
        pytest.skip("this Triton's interpreter has no _convert_float to route fp8 casts through")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_interpreter, "_convert_float",
                      _torch_fp8_downcast(triton_interpreter._convert_float))
        yield
