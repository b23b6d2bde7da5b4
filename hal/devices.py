"""Whether a device the caller names is on this machine: the one check behind selection, `hal
select`, `hal build` and `hal bench`, so each says the same line."""

from __future__ import annotations


class NoDeviceError(ValueError):
    """The device named is not on this machine."""


def torch_build() -> str:
    """The installed torch and what it was built for, e.g. "torch 2.13.0+cpu (a CPU-only build)"."""
    import torch

    hip = getattr(torch.version, "hip", None)
    if torch.version.cuda is not None:
        kind = f"CUDA {torch.version.cuda}"
    elif hip is not None:
        kind = f"ROCm {hip}"
    else:
        kind = "a CPU-only build"
    return f"torch {torch.__version__} ({kind})"


def require_device(device: str) -> None:
    """A NoDeviceError naming `device` and the installed torch build when `device` (normalized:
    "cpu" or "cuda:N") cannot run here."""
    if device == "cpu":
        return
    import torch

    build = torch_build()
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        why = f"the installed {build} runs no GPU"
    elif not torch.cuda.is_available():
        why = f"no GPU is visible to the installed {build}"
    else:
        index = int(device.partition(":")[2] or 0)
        count = torch.cuda.device_count()
        if index < count:
            return
        why = f"{count} GPU(s) are visible to the installed {build}"
    raise NoDeviceError(f"device={device!r}: no {device} on this machine: {why} (device 'cpu' runs "
                        "on the CPU)")
