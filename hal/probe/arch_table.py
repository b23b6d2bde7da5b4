"""Per-architecture facts that hold for every GPU of an arch, and the feature flags an arch implies.

NVML reports no SM limits, so a plain (context-free) probe fills these from this table and marks
them source "arch_table"; `--deep` replaces them with what the driver reports through torch/Triton.
Numbers: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" table
(CUDA 12.8/13.0), in bytes / registers / threads. Anything not in the table stays unknown."""

from __future__ import annotations

from typing import Optional

import attrs

from hal.caps import GpuFeatures

NVIDIA_WARP_SIZE = 32
NVIDIA_SMEM_PER_BLOCK_DEFAULT = 48 * 1024  # static shared memory limit without cudaFuncSetAttribute
NVIDIA_REGS_PER_SM = 64 * 1024  # 32-bit registers, every CC >= 5.0
NVIDIA_REGS_PER_BLOCK = 64 * 1024
NVIDIA_MAX_THREADS_PER_BLOCK = 1024


@attrs.frozen
class NvidiaArch:
    smem_per_sm: int  # bytes, shared memory carve-out maximum per SM
    smem_per_block_optin: int  # bytes, after cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
    max_threads_per_sm: int
    cores_per_sm: int  # FP32 lanes per SM, turns NVML's core count into an SM count


KIB = 1024
NVIDIA_ARCHS = {
    (7, 0): NvidiaArch(96 * KIB, 96 * KIB, 2048, 64),
    (7, 5): NvidiaArch(64 * KIB, 64 * KIB, 1024, 64),
    (8, 0): NvidiaArch(164 * KIB, 163 * KIB, 2048, 64),
    (8, 6): NvidiaArch(100 * KIB, 99 * KIB, 1536, 128),
    (8, 7): NvidiaArch(164 * KIB, 163 * KIB, 1536, 128),
    (8, 9): NvidiaArch(100 * KIB, 99 * KIB, 1536, 128),
    (9, 0): NvidiaArch(228 * KIB, 227 * KIB, 2048, 128),
    (10, 0): NvidiaArch(228 * KIB, 227 * KIB, 2048, 128),
    (10, 3): NvidiaArch(228 * KIB, 227 * KIB, 2048, 128),
    (12, 0): NvidiaArch(100 * KIB, 99 * KIB, 1536, 128),
}


def nvidia_arch(cc: tuple) -> Optional[NvidiaArch]:
    return NVIDIA_ARCHS.get(tuple(cc))


def nvidia_arch_name(cc: tuple) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def nvidia_features(cc: tuple) -> GpuFeatures:
    cc = tuple(cc)
    return GpuFeatures(
        mma_sync=cc >= (8, 0),
        cp_async=cc >= (8, 0),
        tma=cc >= (9, 0),
        wgmma=cc == (9, 0),  # sm_90a only: Blackwell dropped wgmma for tcgen05
        tcgen05=cc in ((10, 0), (10, 3)),  # datacenter Blackwell; consumer sm_120 has none
        fp8="ocp" if cc >= (8, 9) else None,
        mfma=False,
    )


# AMD: CDNA (gfx9xx) runs 64-wide wavefronts, RDNA (gfx10/11/12) 32-wide by default.
AMD_WAVE64_PREFIX = "gfx9"
AMD_MFMA_ARCHS = frozenset({"gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"})
AMD_FP8_FORMATS = {
    "gfx940": "fnuz", "gfx941": "fnuz", "gfx942": "fnuz",  # MI300: e4m3fnuz / e5m2fnuz
    "gfx950": "ocp",  # MI350: OCP e4m3fn / e5m2
    "gfx1200": "ocp", "gfx1201": "ocp",  # RDNA4 WMMA FP8 uses the OCP formats
}


def amd_base_arch(gcn_arch_name: str) -> str:
    """'gfx942:sramecc+:xnack-' -> 'gfx942' (feature suffixes do not change the ISA we target)."""
    return gcn_arch_name.split(":", 1)[0].strip()


def amd_warp_size(gfx: str) -> int:
    return 64 if gfx.startswith(AMD_WAVE64_PREFIX) else 32


def amd_features(gfx: str) -> GpuFeatures:
    return GpuFeatures(mfma=gfx in AMD_MFMA_ARCHS, fp8=AMD_FP8_FORMATS.get(gfx))
