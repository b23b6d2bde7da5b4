"""cpu_brgemm: fused MoE on CPU for bf16, FP8-block and MXFP4 weights, the GEMM path chosen per
expert block (BRGEMM on AMX, or the TinyGEMM micro-kernel). See docs/backends/cpu_brgemm.md."""

from hal.backends.cpu_brgemm.backend import backend

__all__ = ["backend"]
