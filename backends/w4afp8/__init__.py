"""hal.backends.w4afp8: the W4AFP8 MoE on the DeepEP masked layout, whole on the GPU: Triton grouped
GEMMs of int4 (group 128) weights and FP8 activations with FP8 MMA (NVIDIA sm_89+, AMD CDNA3),
the activation and the FP8 requant between the GEMMs fused into GEMM 1's epilogue, and DeepEP's
per-token-group input requantized inside GEMM 1. See docs/backends/w4afp8.md."""

from hal.backends.w4afp8.backend import backend

__all__ = ["backend"]
