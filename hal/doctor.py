"""What this installation can build and run, checked in one place for `hal doctor`: each piece
found or missing, and what a missing piece costs (the backends it takes away).

Essential pieces are the ones without which no layer runs at all or every layer takes the
reference oracle: torch at a supported version, the registered backends, a writable kernel
cache. Everything else narrows the choice of backends."""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Optional

import attrs

MIN_TORCH = (2, 11)
GPU_BACKENDS = "marlin, triton_moe, requant and w4afp8"


@attrs.frozen
class Check:
    name: str
    ok: Optional[bool]  # None: does not apply to this machine
    detail: str
    cost: str = ""  # what is lost while it is missing
    essential: bool = False

    @property
    def blocking(self) -> bool:
        return self.essential and self.ok is False


def checks() -> list:
    """Every check, in the order `hal doctor` prints them."""
    return [_torch(), _gpus(), _cxx(), _nvcc(), _triton(), _cache(), _amx(), _backends()]


def _first_line(command: list) -> Optional[str]:
    """The first non-empty line `command` prints (stdout, else stderr), or None if it cannot run."""
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if run.returncode:
        return None
    lines = [line.strip() for line in (run.stdout or run.stderr).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _torch() -> Check:
    try:
        import torch
    except Exception as exc:
        return Check("torch", False, f"cannot be imported ({type(exc).__name__}: {exc})",
                     "everything: every backend runs on torch tensors", essential=True)
    from hal.devices import torch_build

    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]
                    if part.isdigit())
    if version < MIN_TORCH:
        return Check("torch", False, f"{torch_build()}: moe-hal needs torch >= "
                     f"{'.'.join(map(str, MIN_TORCH))}", "everything", essential=True)
    return Check("torch", True, torch_build(), essential=True)


def _gpus() -> Check:
    import torch

    from hal.devices import torch_build

    cost = f"{GPU_BACKENDS} run on GPUs only; layers run on the CPU"
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return Check("GPUs", False, f"the installed {torch_build()} runs no GPU", cost)
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return Check("GPUs", False, f"none visible to the installed {torch_build()}", cost)
    names = [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    return Check("GPUs", True, ", ".join(names))


def _cxx() -> Check:
    compiler = os.environ.get("CXX", "c++")
    version = _first_line([compiler, "--version"])
    where = f"{compiler} (CXX)" if os.environ.get("CXX") else compiler
    if version is None:
        return Check("C++ compiler", False, f"{where} cannot run; set CXX to a C++17 compiler",
                     "cpu_brgemm (every compiled CPU kernel) and marlin's host code: CPU layers take "
                     "the reference oracle")
    return Check("C++ compiler", True, f"{where}: {version}")


def _nvcc() -> Check:
    from hal.backends.marlin.build import nvcc_archs

    nvcc, archs, why = nvcc_archs()
    cost = "marlin (int4 on NVIDIA GPUs); the Triton backends need no nvcc"
    if nvcc is None or why:
        return Check("nvcc", False, why, cost)
    return Check("nvcc", True, f"{nvcc}: {_release(nvcc)}; targets {', '.join(archs) or 'no sm_ arch'}")


def _release(nvcc: str) -> str:
    """nvcc's release line ("Cuda compilation tools, release 13.0, V13.0.88")."""
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "version unknown"
    return next((line.strip() for line in text.splitlines() if "release" in line), "version unknown")


def _triton() -> Check:
    from hal.registry import discover

    try:
        import triton
    except Exception as exc:
        return Check("triton", False, f"cannot be imported ({type(exc).__name__}: {exc})",
                     ", ".join(sorted(f.name for f in discover()
                                      if f.backend and "triton" in getattr(f.backend, "packages", ()))))
    return Check("triton", True, f"triton {getattr(triton, '__version__', 'unknown version')}")


def _cache() -> Check:
    from hal.jit import CacheDirError, usable_cache_dir

    try:
        root = usable_cache_dir()
    except CacheDirError as exc:
        return Check("kernel cache", False, str(exc), "every compiled kernel (cpu_brgemm, marlin): "
                     "layers take the reference oracle", essential=True)
    return Check("kernel cache", True, f"{root} (writable)", essential=True)


def _amx() -> Check:
    from hal.probe.cpu import probe_cpu

    amx = probe_cpu().amx
    if not amx.cpuid:
        return Check("AMX", None, f"not on this CPU ({platform.processor() or platform.machine()})")
    if amx.usable:
        return Check("AMX", True, amx.reason or "usable")
    return Check("AMX", False, amx.reason, "cpu_brgemm's AMX tiles: bf16 GEMMs run on AVX-512 instead")


def _backends() -> Check:
    from hal.registry import discover

    found = discover()
    loaded = [d.name for d in found if d.backend is not None]
    failed = [f"{d.name} ({d.error})" for d in found if d.backend is None]
    if "reference" not in loaded:
        return Check("backends", False, "; ".join(failed) or "none registered: install the package "
                     "(pip install -e .) so its entry points are listed", "every layer", essential=True)
    detail = ", ".join(loaded) + (f"; not loaded: {'; '.join(failed)}" if failed else "")
    return Check("backends", True, detail, "the backends that did not load" if failed else "",
                 essential=True)
