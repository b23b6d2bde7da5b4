"""Hardware markers: a test whose hardware is absent is skipped with the reason, never failed."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def this_machine():
    import hal

    return hal.probe()


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


POISON_BYTE = 0x7F  # NaN in float8_e4m3fn; in any 1-byte tensor a value kernels are checked against


def poison(t):
    """Fill a tensor with a value no kernel writes, so unwritten elements show: NaN for float
    tensors, the byte 0x7F for 1-byte ones, -1 for integers."""
    import torch

    if t.element_size() == 1:
        t.view(torch.uint8).fill_(POISON_BYTE)
    else:
        t.fill_(float("nan") if t.dtype.is_floating_point else -1)
    return t
