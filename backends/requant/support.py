"""Whether a target can run the requant, from hal's capabilities alone. The backend's check() uses
this on every `hal probe`, so it imports neither torch nor Triton."""

from __future__ import annotations

from typing import Optional

from hal.backends.requant import tuning

from hal.caps import GpuCaps

FP8_ENCODINGS = ("ocp", "fnuz")  # the encodings device.FP8_DTYPES maps to torch dtypes


def gpu_problems(gpu: Optional[GpuCaps]) -> list:
    """Every reason these GPU capabilities cannot run the requant, as sentences."""
    if gpu is None:
        return ["no GPU capabilities for this device"]
    reasons = []
    if not gpu.warp_size:
        why = gpu.unknown.get("warp_size", "not probed")
        reasons.append(f"the warp size of {gpu.name or gpu.arch or 'this GPU'} is unknown ({why})")
    if gpu.features.fp8 not in FP8_ENCODINGS:
        reasons.append(f"{gpu.name or gpu.arch or 'this GPU'} ({gpu.arch}) has no FP8 e4m3 support "
                       "that Triton converts to")
    cc = gpu.compute_capability
    if gpu.vendor == "nvidia" and cc is not None and cc < tuning.MIN_NVIDIA_FP8_CAPABILITY:
        need = "sm_{}{}".format(*tuning.MIN_NVIDIA_FP8_CAPABILITY)
        reasons.append(f"{gpu.arch} is below {need}: Triton's fp32 -> e4m3fn conversion needs {need}")
    return reasons
