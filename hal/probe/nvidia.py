"""NVIDIA GPUs: NVML first (no CUDA context, fork-safe), torch and Triton only when deep.

NVML enumerates physical GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES; torch numbers the
visible ones. GpuCaps.index is torch's number (what "cuda:N" means), so NVML devices are mapped
through CUDA_VISIBLE_DEVICES first."""

from __future__ import annotations

import os
from typing import Optional

from hal.caps import GpuCaps
from hal.probe import arch_table
from hal.probe.findings import Findings
from hal.probe.torch_access import TORCH_PROPERTIES, torch_cuda_archs, torch_module

NVML_DDR_FACTOR = 2  # HBM/GDDR move data on both clock edges; NVML's memory clock is the base rate
DEEP_HINT = "hal probe --deep reads it through torch (creates a CUDA context)"


def visible_nvml_indices(cuda_visible_devices: Optional[str], uuids: list) -> list:
    """NVML indices in torch's order. CUDA stops at the first entry it cannot resolve."""
    if cuda_visible_devices is None:
        return list(range(len(uuids)))
    order = []
    for entry in cuda_visible_devices.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < len(uuids):
            index = int(entry)
        else:
            matches = [i for i, u in enumerate(uuids) if entry and u.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in order:
            break
        order.append(index)
    return order


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version_text(version: int) -> str:
    """NVML's 13000 -> '13.0'."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _read_nvml(pynvml, handle, found: Findings) -> None:
    with found.attempt("name"):
        found.found("name", _text(pynvml.nvmlDeviceGetName(handle)), "nvml")
    with found.attempt("memory_bytes"):
        found.found("memory_bytes", int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), "nvml")
    with found.attempt("arch"):
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        found.found("arch", arch_table.nvidia_arch_name((major, minor)), "nvml")
    with found.attempt("mem_bandwidth_gbps"):
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        found.found("mem_bandwidth_gbps",
                    round(bus_bits / 8 * clock_mhz * 1e6 * NVML_DDR_FACTOR / 1e9, 1), "nvml")
    with found.attempt("sm_count"):
        cc = _cc(found)
        arch = arch_table.nvidia_arch(cc) if cc else None
        if arch is not None and hasattr(pynvml, "nvmlDeviceGetNumGpuCores"):
            cores = pynvml.nvmlDeviceGetNumGpuCores(handle)
            found.found("sm_count", cores // arch.cores_per_sm, "nvml+arch_table")
    found.missing("sm_count", f"NVML reports no SM count for this arch; {DEEP_HINT}")


def _cc(found: Findings) -> Optional[tuple]:
    arch = found.get("arch")
    if not arch:
        return None
    digits = arch[3:]
    return int(digits[:-1]), int(digits[-1])


def _nvml_gpus(gpus: dict, section_unknown: dict) -> None:
    try:
        import pynvml
    except ImportError as exc:
        section_unknown["gpus.nvidia"] = f"NVML unavailable: {exc} (pip install nvidia-ml-py)"
        return
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        section_unknown["gpus.nvidia"] = f"nvmlInit failed: {type(exc).__name__}: {exc} (no NVIDIA driver?)"
        return
    try:
        driver = api = None
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            api = _cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion())
        except Exception as exc:
            section_unknown["gpus.nvidia.driver"] = f"{type(exc).__name__}: {exc}"
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        order = visible_nvml_indices(visible, uuids)
        if count and not order and visible and "MIG-" in visible:
            section_unknown["gpus.nvidia"] = (f"CUDA_VISIBLE_DEVICES={visible!r} names MIG instances, "
                                              "which this probe does not resolve: hal probe --deep "
                                              "reads them through torch")
        for index, nvml_index in enumerate(order):
            found = gpus.setdefault(index, Findings())
            found.found("vendor", "nvidia", "nvml")
            found.found("driver_version", driver, "nvml")
            found.found("driver_api_version", api, "nvml")
            _read_nvml(pynvml, handles[nvml_index], found)
    except Exception as exc:
        section_unknown["gpus.nvidia"] = f"NVML enumeration failed: {type(exc).__name__}: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # shutting down is best effort; the values are already read
            pass


TRITON_PROPERTIES = {  # GpuCaps field -> triton driver utils get_device_properties key
    "regs_per_block": "max_num_regs",
    "smem_per_block_optin": "max_shared_mem",
    "sm_count": "multiprocessor_count",
    "warp_size": "warpSize",
}


def _deep_gpus(torch, gpus: dict, section_unknown: dict) -> None:
    """Properties only the CUDA runtime reports; creates a context on every visible GPU."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        section_unknown.setdefault("gpus.nvidia.deep", "torch has no usable CUDA (CPU or ROCm build, "
                                                       "or no device)")
        return
    triton_utils = None
    try:
        from triton.runtime import driver

        triton_utils = driver.active.utils
    except Exception as exc:
        section_unknown["gpus.nvidia.triton"] = f"Triton unavailable: {type(exc).__name__}: {exc}"
    for index in range(torch.cuda.device_count()):
        found = gpus.setdefault(index, Findings())
        found.found("vendor", "nvidia", "torch")
        with found.attempt(*TORCH_PROPERTIES, "arch"):
            props = torch.cuda.get_device_properties(index)
            found.found("arch", arch_table.nvidia_arch_name((props.major, props.minor)), "torch")
            for field, attr in TORCH_PROPERTIES.items():
                found.found(field, getattr(props, attr, None), "torch")
        if triton_utils is not None:
            with found.attempt(*TRITON_PROPERTIES):
                props = triton_utils.get_device_properties(index)
                for field, key in TRITON_PROPERTIES.items():
                    if not found.has(field):  # torch's reading wins where both report a field
                        found.found(field, props.get(key), "triton")


def _fill_from_arch_table(found: Findings) -> None:
    """Per-arch constants for what neither NVML nor a deep probe gave, marked as such."""
    cc = _cc(found)
    arch = arch_table.nvidia_arch(cc) if cc else None
    constants = {
        "warp_size": arch_table.NVIDIA_WARP_SIZE,
        "smem_per_block": arch_table.NVIDIA_SMEM_PER_BLOCK_DEFAULT,
        "regs_per_sm": arch_table.NVIDIA_REGS_PER_SM,
        "regs_per_block": arch_table.NVIDIA_REGS_PER_BLOCK,
        "max_threads_per_block": arch_table.NVIDIA_MAX_THREADS_PER_BLOCK,
    }
    if arch is not None:
        constants.update(smem_per_block_optin=arch.smem_per_block_optin, smem_per_sm=arch.smem_per_sm,
                         max_threads_per_sm=arch.max_threads_per_sm)
    for field, value in constants.items():
        if not found.has(field):
            found.found(field, value, "arch_table")
    if cc is None:
        found.missing("features", "arch unknown, so no arch-derived features")
    else:
        found.found("features", arch_table.nvidia_features(cc), "arch_table")
    for field in ("smem_per_block_optin", "smem_per_sm", "max_threads_per_sm"):
        found.missing(field, f"arch {found.get('arch')} not in the arch table; {DEEP_HINT}")
    found.missing("l2_bytes", f"NVML does not report L2; {DEEP_HINT}")


def probe_nvidia(deep: bool, section_unknown: dict) -> list:
    """One GpuCaps per visible NVIDIA GPU; never raises (failures land in `section_unknown`)."""
    gpus: dict = {}
    _nvml_gpus(gpus, section_unknown)
    torch = None
    try:
        torch = torch_module(deep)
        if torch is not None and deep:
            _deep_gpus(torch, gpus, section_unknown)
    except Exception as exc:
        section_unknown["gpus.nvidia.deep"] = f"{type(exc).__name__}: {exc}"
    result = []
    for index in sorted(gpus):
        found = gpus[index]
        _fill_from_arch_table(found)
        if torch is not None and torch.version.cuda is not None:
            found.found("runtime_version", torch.version.cuda, "torch")
            with found.attempt("torch_archs"):
                found.found("torch_archs", torch_cuda_archs(torch, deep) or None, "torch")
        found.missing("runtime_version", "read from torch.version.cuda: torch not imported (plain probe)"
                      " or not a CUDA build")
        found.missing("torch_archs", "read from torch's build flags only with --deep (reading them "
                      "registers torch's fork guard) or on a CUDA build")
        result.append(GpuCaps(index=index, **found.fields_of(GpuCaps), sources=found.sources,
                              unknown=found.unknown))
    return result
