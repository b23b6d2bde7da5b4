"""Hardware markers: a test whose hardware is absent is skipped with the reason, never failed."""

from __future__ import annotations

import pytest


def this_machine():
    from hal.testing import live_cpu_caps

    return live_cpu_caps()


def _cuda_reason():
    try:
        import torch
    except ImportError as exc:
        return f"torch not importable: {exc}"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    if not torch.cuda.is_available():
        return "no CUDA device visible"
    return None


def _sm90_reason():
    reason = _cuda_reason()
    if reason:
        return reason
    import torch

    major, minor = torch.cuda.get_device_capability()
    return None if (major, minor) == (9, 0) else f"GPU is sm_{major}{minor}, not sm_90"


def _rocm_reason():
    import torch

    if torch.version.hip is None or not torch.cuda.is_available():
        return "no ROCm build of torch with a visible AMD GPU"
    return None


def _amx_reason():
    amx = this_machine().cpu.amx
    if amx.usable:
        return None
    return f"AMX not usable here: {amx.reason or 'cpuid/os/permission missing'}"


def _avx512_reason():
    return None if this_machine().cpu.isa.avx512 else "CPU lacks AVX-512 F/BW/VL/DQ"


SKIP_REASONS = {
    "cuda": _cuda_reason,
    "sm90": _sm90_reason,
    "rocm": _rocm_reason,
    "amx": _amx_reason,
    "avx512": _avx512_reason,
}


def pytest_collection_modifyitems(config, items):
    cache = {}
    for item in items:
        for marker, reason_of in SKIP_REASONS.items():
            if marker in item.keywords:
                if marker not in cache:
                    cache[marker] = reason_of()
                if cache[marker]:
                    item.add_marker(pytest.mark.skip(reason=f"[{marker}] {cache[marker]}"))
                    break
