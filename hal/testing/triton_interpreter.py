"""Triton's CPU interpreter with its fp32 -> fp8 casts routed through torch.

The interpreter rounds fp32 -> e4m3 half-up and drops the carry into the exponent (Triton 3.9:
125.8 -> 64 instead of 128, just below a power of two), unlike the GPU's round-to-nearest-even
cvt.rn.satfinite. `fp8_casts_through_torch()` routes those casts through torch's
round-to-nearest-even so interpreter runs test a kernel's indexing, masks, unpacking, scales and
arithmetic; GPU tests check the hardware cast itself.

Triton chooses interpreter or compiler (for its own library functions too: tl.cumsum, tl.sum) when
it is first imported, so TRITON_INTERPRET=1 must be in the environment before pytest starts
(tox -e cpu sets it)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


def _torch_fp8_downcast(convert_float):
    """Wraps the interpreter's `_convert_float`: fp32 -> e4m3 (fn and fnuz) goes through torch,
    every other conversion through `convert_float`."""
    import numpy as np
    import triton.language as tl

    torch_dtypes = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e4b8: torch.float8_e4m3fnuz}

    def convert(values, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype in torch_dtypes:
            fp32 = torch.from_numpy(np.ascontiguousarray(values).view(np.float32))
            return fp32.to(torch_dtypes[output_dtype]).view(torch.uint8).numpy().reshape(values.shape)
        return convert_float(values, input_dtype, output_dtype, rounding_mode)

    return convert


@contextlib.contextmanager
def fp8_casts_through_torch() -> Iterator[None]:
    """Patch Triton's interpreter so fp32 -> fp8 casts round as torch (and the GPU) do, for the
    duration of the block. Skips the calling test when TRITON_INTERPRET was not set before Triton's
    import, when Triton or its interpreter cannot be imported (naming the import error), or when
    this Triton's interpreter has no `_convert_float`."""
    import pytest  # here, so importing hal.testing does not need pytest

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 set before pytest starts (Triton reads it at import)")
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # the real cause: no Triton, or a module it needs (numpy)
        pytest.skip(f"Triton cannot be imported: {exc}")
    try:
        from triton.runtime import interpreter as triton_interpreter
    except ImportError as exc:  # a module only the interpreter needs is missing
        pytest.skip(f"Triton's interpreter cannot be imported: {exc}")

    if not hasattr(triton_interpreter, "_convert_float"):
        pytest.skip("this Triton's interpreter has no _convert_float to route fp8 casts through")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_interpreter, "_convert_float",
                      _torch_fp8_downcast(triton_interpreter._convert_float))
        yield
