"""AMD GPUs: amdsmi when installed (no HIP context), torch's HIP device properties when deep.

Fields are named as on NVIDIA: sm_count holds compute units, warp_size the wavefront (64 on CDNA,
32 on RDNA), smem the LDS. The gfx name keeps only the ISA: 'gfx942:sramecc+:xnack-' -> 'gfx942'."""

from __future__ import annotations

import os

from hal.caps import GpuCaps
from hal.probe import arch_table
from hal.probe.findings import Findings
from hal.probe.torch_access import TORCH_PROPERTIES, gpu_runtime_initialized, torch_cuda_archs, torch_module

VISIBILITY_VARIABLES = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
BYTES_PER_MIB = 1024 * 1024
DEEP_HINT = "hal probe --deep reads it through torch's HIP properties (creates a HIP context)"



def _amdsmi_gpus(gpus: dict, section_unknown: dict) -> None:
    """Name, gfx target and memory without a HIP context. Skipped when a visibility variable
    reorders devices, since amdsmi lists every GPU in its own order."""
    try:
        import amdsmi
    except ImportError:
        section_unknown["gpus.amd.amdsmi"] = "amdsmi not installed: AMD GPUs are read only with --deep"
        return
    hidden_by = [v for v in VISIBILITY_VARIABLES if os.environ.get(v) is not None]
    if hidden_by:
        section_unknown["gpus.amd.amdsmi"] = f"{hidden_by[0]} is set: amdsmi order would not match torch's"
        return
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:
        section_unknown["gpus.amd.amdsmi"] = f"amdsmi_init failed: {type(exc).__name__}: {exc}"
        return
    try:
        for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            found = gpus.setdefault(index, Findings())
            found.found("vendor", "amd", "amdsmi")
            with found.attempt("name", "arch", "sm_count"):
                asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
                found.found("name", asic.get("market_name"), "amdsmi")
                target = asic.get("target_graphics_version")
                found.found("arch", arch_table.amd_base_arch(str(target)) if target else None, "amdsmi")
                found.found("sm_count", asic.get("num_compute_units"), "amdsmi")
            with found.attempt("memory_bytes"):
                vram = amdsmi.amdsmi_get_gpu_vram_info(handle)
                size_mib = vram.get("vram_size")
                found.found("memory_bytes", int(size_mib) * BYTES_PER_MIB if size_mib else None, "amdsmi")
            with found.attempt("driver_version"):
                info = amdsmi.amdsmi_get_gpu_driver_info(handle)
                found.found("driver_version", info.get("driver_version"), "amdsmi")
    except Exception as exc:
        section_unknown["gpus.amd.amdsmi"] = f"amdsmi enumeration failed: {type(exc).__name__}: {exc}"
    finally:
        try:
            amdsmi.amdsmi_shut_down()
        except Exception:  # best effort; the values are already read
            pass


def _torch_gpus(torch, gpus: dict) -> None:
    for index in range(torch.cuda.device_count()):
        found = gpus.setdefault(index, Findings())
        found.found("vendor", "amd", "torch")
        with found.attempt(*TORCH_PROPERTIES, "arch"):
            props = torch.cuda.get_device_properties(index)
            gcn = getattr(props, "gcnArchName", None)
            found.found("arch", arch_table.amd_base_arch(gcn) if gcn else None, "torch")
            for field, attr in TORCH_PROPERTIES.items():
                found.found(field, getattr(props, attr, None), "torch")


def probe_amd(deep: bool, section_unknown: dict) -> list:
    """One GpuCaps per visible AMD GPU; never raises (failures land in `section_unknown`)."""
    gpus: dict = {}
    torch = None
    try:
        torch = torch_module(deep)
        hip = torch is not None and getattr(torch.version, "hip", None)
        if hip and (deep or gpu_runtime_initialized(torch)):
            _torch_gpus(torch, gpus)
        elif torch is not None and hip:
            section_unknown["gpus.amd"] = f"HIP not initialised: {DEEP_HINT}"
    except Exception as exc:
        section_unknown["gpus.amd"] = f"{type(exc).__name__}: {exc}"
    if not gpus:
        _amdsmi_gpus(gpus, section_unknown)
    result = []
    for index in sorted(gpus):
        found = gpus[index]
        arch = found.get("arch")
        if arch:
            if not found.has("warp_size"):
                found.found("warp_size", arch_table.amd_warp_size(arch), "arch_table")
            found.found("features", arch_table.amd_features(arch), "arch_table")
        if torch is not None and getattr(torch.version, "hip", None):
            found.found("runtime_version", torch.version.hip, "torch")
            found.found("torch_archs", torch_cuda_archs(torch, deep) or None, "torch")
        for field in ("warp_size", "features", "smem_per_block", "smem_per_block_optin", "smem_per_sm",
                      "regs_per_sm", "regs_per_block", "max_threads_per_sm", "max_threads_per_block",
                      "l2_bytes", "mem_bandwidth_gbps", "runtime_version", "torch_archs"):
            found.missing(field, f"not read: {DEEP_HINT}")
        result.append(GpuCaps(index=index, **found.fields_of(GpuCaps), sources=found.sources,
                              unknown=found.unknown))
    return result
