"""What the requant needs to know about the GPU it runs on, taken from hal's capabilities: the warp
size that sizes its tile and the FP8 encoding it writes. Never a literal of either."""

from __future__ import annotations

import functools
from typing import Optional

import attrs
import torch
from hal.backends.requant import tuning
from hal.backends.requant.support import gpu_problems

from hal.backend import triton_interpreting
from hal.caps import GpuCaps

FP8_DTYPES = {"ocp": torch.float8_e4m3fn, "fnuz": torch.float8_e4m3fnuz}


@attrs.frozen
class DeviceTraits:
    warp_size: int
    fp8_dtype: torch.dtype
    source: str  # where the two came from, for plan().describe()

    @property
    def fp8_max(self) -> float:
        return float(torch.finfo(self.fp8_dtype).max)


def traits_from_gpu(gpu: GpuCaps, source: str) -> DeviceTraits:
    problems = gpu_problems(gpu)
    if problems:
        raise ValueError("the requant cannot run on this GPU: " + "; ".join(problems))
    return DeviceTraits(gpu.warp_size, FP8_DTYPES[gpu.features.fp8], source)


@functools.cache
def _live_traits(index: int) -> DeviceTraits:
    """For a caller that gives no capabilities: this machine's, with the live facts hal.live adds
    (the warp size NVML does not report)."""
    import hal
    from hal.backend import Target
    from hal.live import refine

    target = refine(Target(f"cuda:{index}", hal.probe()))
    if target.gpu is None:
        raise ValueError(f"hal.probe() lists no GPU with index {index}: GPUs "
                         f"{[g.index for g in target.caps.gpus]}")
    return traits_from_gpu(target.gpu, f"hal caps of cuda:{index} ({target.caps.profile or 'probed'})")


def device_traits(device: torch.device, gpu: Optional[GpuCaps] = None) -> DeviceTraits:
    """The traits for tensors on `device`: from `gpu` when given, else from this machine's
    capabilities (hal.probe() refined by hal.live) for a GPU, else the interpreter's defaults on
    CPU under TRITON_INTERPRET=1."""
    if gpu is not None:
        return traits_from_gpu(gpu, f"given caps of {gpu.name or gpu.arch}")
    if device.type == "cuda":
        return _live_traits(device.index if device.index is not None else torch.cuda.current_device())
    if device.type == "cpu" and triton_interpreting():
        return DeviceTraits(tuning.INTERPRETER_WARP_SIZE, torch.float8_e4m3fn,
                            "Triton interpreter (TRITON_INTERPRET=1)")
    raise ValueError(f"x is on {device}: the requant runs on a GPU, or on CPU under "
                     "TRITON_INTERPRET=1")
