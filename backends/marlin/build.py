"""What the Marlin kernels need to build, and the build itself: one hal.jit specialization per
(activation dtype, kIsEP, kHasBias, arch), compiled for the device's own arch only."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from typing import Optional

import attrs

from hal.caps import GpuCaps

SOURCES = ("cuda/marlin_moe.cu", "cuda/marlin_moe_binding.cpp")
MIN_COMPUTE_CAPABILITY = (8, 0)  # mma.sync m16n8k16 with bf16 inputs and cp.async


class ToolchainError(RuntimeError):
    """This host cannot build the Marlin extension; the message lists every reason."""


@attrs.frozen
class Specialization:
    act_dtype: str  # bfloat16 | float16
    is_ep: bool
    has_bias: bool
    arch: str  # "sm_90"

    @property
    def cc_digits(self) -> str:
        return re.sub(r"[^0-9]", "", self.arch)

    @property
    def wgmma(self) -> bool:
        """bf16 on sm_90 builds for sm_90a, whose wgmma the kernel's wgmma configs issue (no other
        arch has it: sm_100 and later replaced it). fp16 keeps mma.sync: its wgmma instantiation
        compiles but has not been run on a GPU."""
        return self.cc_digits == "90" and self.act_dtype == "bfloat16"

    def defines(self) -> dict:
        return {"HAL_MARLIN_FP16": int(self.act_dtype == "float16"),
                "HAL_MARLIN_IS_EP": int(self.is_ep), "HAL_MARLIN_HAS_BIAS": int(self.has_bias),
                "HAL_MARLIN_WGMMA": int(self.wgmma)}

    def cuda_flags(self) -> tuple:
        # Naming the arch also stops torch from adding its own -gencode list.
        cc = self.cc_digits + ("a" if self.wgmma else "")
        return ("-gencode", f"arch=compute_{cc},code=sm_{cc}", "--expt-relaxed-constexpr")

    def describe(self) -> str:
        return (f"{self.act_dtype}, kIsEP={int(self.is_ep)}, kHasBias={int(self.has_bias)}, "
                f"{self.arch}")


def arch_problems(gpu: Optional[GpuCaps], device: str) -> list:
    """Reasons the caps alone rule the GPU out (pure: works on recorded profiles)."""
    if gpu is None:
        return [f"no GPU capabilities are known for {device}"]
    if gpu.vendor != "nvidia":
        return [f"GPU {gpu.name or gpu.index} is {gpu.vendor or 'of unknown vendor'}: the Marlin "
                "kernels use NVIDIA mma.sync and cp.async"]
    cc = gpu.compute_capability
    if cc is None:
        return [f"GPU {gpu.name or gpu.index} has no known compute capability (arch={gpu.arch!r})"]
    if cc < MIN_COMPUTE_CAPABILITY:
        return [f"GPU {gpu.name or gpu.index} is {gpu.arch}: the Marlin kernels need sm_80 or newer "
                "(bf16 mma.sync m16n8k16 and cp.async)"]
    return []


def _nvcc() -> Optional[str]:
    """The nvcc torch's extension builder would use, found as it finds it (CUDA_HOME or
    CUDA_PATH, then PATH, then /usr/local/cuda) but without importing torch."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        candidate = os.path.join(home, "bin", "nvcc") if home else None
        if candidate and os.path.exists(candidate):
            return candidate
    found = shutil.which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.path.exists(default) else None


@functools.cache
def nvcc_archs() -> tuple:
    """(nvcc path or None, the real archs it can target, why it could not be asked)."""
    nvcc = _nvcc()
    if nvcc is None:
        return None, (), "nvcc was not found (set CUDA_HOME or put nvcc on PATH)"
    try:
        text = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return nvcc, (), f"{nvcc} --list-gpu-code failed: {exc}"
    return nvcc, tuple(sorted(set(re.findall(r"sm_\d+[a-z]?", text)))), None


def toolchain_problems(arch: str) -> list:
    """Reasons this host cannot build for `arch` (torch without CUDA, no nvcc, nvcc too old).
    Asked by the backend's build(), never by check(): selection stays a function of the caps."""
    import torch

    problems = []
    if torch.version.cuda is None:
        problems.append(f"the installed torch {torch.__version__} is not a CUDA build, so the Marlin "
                        "extension cannot be built or loaded")
    nvcc, archs, why = nvcc_archs()
    if why:
        problems.append(why)
    elif arch.rstrip("a") not in archs:
        problems.append(f"{nvcc} cannot generate code for {arch} (it targets {', '.join(archs)})")
    return problems


def compile_ops(spec: Specialization):
    """Build (or load from the cache) one specialization; returns its torch.ops namespace."""
    import torch

    from hal import jit

    namespace = jit.build("marlin_moe", SOURCES, defines=spec.defines(),
                          extra_cuda_cflags=spec.cuda_flags(), cuda=True)
    return getattr(torch.ops, namespace)


# Fake kernels of the ops that take tensors, for torch.compile's twins (hal.traceable);
# kernel_attributes takes none and is read once, outside any traced call.
def _route_fake(topk_ids, expert_map, num_experts, block_m):
    """(sorted routes, block -> expert, block count, route -> expert), int32, sized for the most
    blocks the routes can make (the C++ max_blocks_for)."""
    import torch

    routes = topk_ids.numel()
    max_blocks = (routes + block_m - 1) // block_m + torch.sym_min(num_experts, routes)
    new = lambda *shape: topk_ids.new_empty(shape, dtype=torch.int32)  # noqa: E731
    return new(max_blocks * block_m), new(max_blocks), new(1), new(routes)


def _writes_in_place_fake(*args) -> None:
    """gemm and moe write their declared Tensor(a!) argument and return nothing."""


FAKES = {"route": _route_fake, "gemm": _writes_in_place_fake, "moe": _writes_in_place_fake}
