"""Capability probe: what this machine's CPU and GPUs can do, with where each fact came from.

    probe()                 files, arch_prctl (which also asks for AMX permission where the CPU
                            and kernel support it) and NVML: fast, no CUDA context, fork-safe
    probe(deep=True)        also torch/Triton device properties (creates a CUDA/HIP context)
    probe(profile="h200")   a recorded profile instead of this machine; HAL_CAPS=file.json likewise
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Optional

from hal.caps import Caps
from hal.probe.amx import request_amx_permission
from hal.probe.bandwidth import measure_memory_bandwidth, with_measured_bandwidth
from hal.probe.cpu import probe_cpu
from hal.probe.profiles import HAL_CAPS_VARIABLE, list_profiles, load_hal_caps, load_profile

__all__ = ["probe", "list_profiles", "load_profile", "request_amx_permission",
           "measure_memory_bandwidth", "with_measured_bandwidth"]


def probe(deep: bool = False, profile: Optional[str] = None) -> Caps:
    """This machine's capabilities, or a recorded profile's.

    `profile` (a name from list_profiles() or a .json path) wins over the HAL_CAPS variable, which
    wins over probing. A live probe never raises; a bad profile name raises ValueError."""
    if profile is not None:
        return load_profile(profile)
    from_env = os.environ.get(HAL_CAPS_VARIABLE)
    if from_env:
        return load_hal_caps(from_env)
    return _probe_live(bool(deep))


def _probe_live(deep: bool) -> Caps:
    from hal.probe.amd import probe_amd
    from hal.probe.nvidia import probe_nvidia

    section_unknown: dict = {}
    cpu = probe_cpu()
    gpus = _guarded(lambda: probe_nvidia(deep, section_unknown), "gpus.nvidia", section_unknown)
    gpus += _guarded(lambda: probe_amd(deep, section_unknown), "gpus.amd", section_unknown)
    return Caps(cpu=cpu, gpus=tuple(gpus), software=_software(deep), deep=deep, unknown=section_unknown)


def _guarded(step, name: str, section_unknown: dict) -> list:
    try:
        return list(step())
    except Exception as exc:  # the probe never raises: a failing vendor costs only its GPUs
        section_unknown[name] = f"{type(exc).__name__}: {exc}"
        return []


def _software(deep: bool) -> dict:
    """Versions that change what can be built; torch/Triton only if already imported or deep."""
    versions = {"python": platform.python_version(), "kernel": platform.release()}
    for module in ("torch", "triton"):
        loaded = sys.modules.get(module)
        if loaded is None and deep:
            try:
                loaded = __import__(module)
            except Exception as exc:
                versions[module] = f"unavailable: {type(exc).__name__}: {exc}"
                continue
        if loaded is not None:
            versions[module] = str(getattr(loaded, "__version__", "unknown"))
    return versions
