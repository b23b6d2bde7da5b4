"""When the probe may touch torch.

Importing torch costs over a second on small machines, and initialising its CUDA/HIP runtime breaks
any later fork. So a plain probe reads torch only when the caller already imported it, and then only
build-time facts (versions, compiled archs) that create no context; a deep probe imports it."""

from __future__ import annotations

import sys

TORCH_PROPERTIES = {  # GpuCaps field -> torch.cuda.get_device_properties attribute (CUDA and ROCm)
    "name": "name",
    "memory_bytes": "total_memory",
    "sm_count": "multi_processor_count",
    "warp_size": "warp_size",
    "smem_per_block": "shared_memory_per_block",
    "smem_per_block_optin": "shared_memory_per_block_optin",
    "smem_per_sm": "shared_memory_per_multiprocessor",
    "regs_per_sm": "regs_per_multiprocessor",
    "max_threads_per_sm": "max_threads_per_multi_processor",
    "l2_bytes": "L2_cache_size",
}


def torch_module(deep: bool):
    """torch when deep or already imported by the caller, else None."""
    if deep:
        import torch

        return torch
    return sys.modules.get("torch")


def torch_cuda_archs(torch, deep: bool) -> tuple:
    """The archs the installed torch build carries kernels for; () unless deep or already initialised.

    Even this build-time fact is fork-unsafe: torch._C._cuda_getArchFlags registers torch's at-fork
    hook, so a child forked afterwards refuses CUDA ("Cannot re-initialize CUDA in forked
    subprocess") although no context exists. Observed with torch 2.11 on an H200."""
    if not (deep or gpu_runtime_initialized(torch)):
        return ()
    flags = torch._C._cuda_getArchFlags() if hasattr(torch._C, "_cuda_getArchFlags") else None
    return tuple(flags.split()) if flags else ()


def gpu_runtime_initialized(torch) -> bool:
    """True when torch already created its CUDA/HIP runtime, so reading properties costs nothing."""
    return bool(torch.cuda.is_initialized())
