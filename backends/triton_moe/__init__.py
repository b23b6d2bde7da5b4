"""hal.backends.triton_moe: a fused Triton MoE for the token layout on NVIDIA (sm_80+) and AMD (CDNA,
RDNA3) GPUs, for bf16, fp8_block128, mxfp4 and int4_g128 weights, dequantized in registers.
Entry point: triton_moe = "hal.backends.triton_moe:backend".

Triton is imported only when a kernel is built, so a machine without Triton gets a rejection with
the reason rather than a failed import."""

from __future__ import annotations

from hal.backends.triton_moe.backend import backend

__all__ = ["backend"]
