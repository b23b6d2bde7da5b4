"""hal.backends.requant: the Triton per-token-group FP8 -> per-tensor FP8 requant of the DeepEP masked
layout, with a warp-size-aware launch geometry and a second phase that shares a hot expert's rows.
It serves the requant op and the w4afp8 moe_masked op (its GEMM stages on hal.backends.reference).
See docs/backends/requant.md."""

from hal.backends.requant.backend import backend
from hal.backends.requant.geometry import RequantGeometry, requant_launch_geometry

__all__ = ["RequantGeometry", "backend", "requant_launch_geometry"]
