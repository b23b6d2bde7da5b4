"""The human-readable `hal probe` table: one row per fact with the source it came from."""

from __future__ import annotations

import attrs

from hal.caps import Caps, CpuCaps, GpuCaps, IsaFlags

LABEL_WIDTH = 22
VALUE_WIDTH = 56


def _bytes(n) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def _yes(flag) -> str:
    return {True: "yes", False: "no", None: "?"}[flag]


def _row(label: str, value, source: str = "") -> str:
    text = "?" if value is None else str(value)
    tag = f"[{source}]" if source else ""
    return f"  {label:<{LABEL_WIDTH}}{text:<{VALUE_WIDTH}} {tag}".rstrip()


def _cpu_rows(cpu: CpuCaps) -> list:
    src = cpu.sources
    identity = f"{cpu.model_name or '?'} ({cpu.vendor or '?'} family {cpu.family} model {cpu.model} " \
               f"stepping {cpu.stepping})"
    isa = " ".join(f.name for f in attrs.fields(IsaFlags) if getattr(cpu.isa, f.name)) or "none listed"
    amx = cpu.amx
    amx_text = (f"cpuid {_yes(amx.cpuid)}, os {_yes(amx.os_support)}, permitted {_yes(amx.permitted)}"
                f" -> {'usable' if amx.usable else 'not usable'}")
    rows = [
        _row("model", identity, src.get("model_name", "")),
        _row("ISA", isa, src.get("isa", "")),
        _row("AMX", amx_text, src.get("amx", "")),
    ]
    if amx.reason:
        rows.append(_row("", f"({amx.reason})"))
    rows += [
        _row("logical CPUs", cpu.logical_cpus, src.get("logical_cpus", "")),
        _row("physical cores", cpu.physical_cores, src.get("physical_cores", "")),
        _row("usable CPUs", cpu.usable_cpus, src.get("usable_cpus", "")),
        _row("NUMA nodes", cpu.numa_nodes, src.get("numa_nodes", "")),
    ]
    for cache in cpu.caches:
        kind = {"data": "d", "instruction": "i"}.get(cache.kind, "")
        scope = "per core" if cache.per_core else f"shared by {cache.shared_by_cpus} CPUs"
        rows.append(_row(f"L{cache.level}{kind} cache", f"{_bytes(cache.size_bytes)}, {scope}",
                         src.get("caches", "")))
    bandwidth = None if cpu.mem_bandwidth_gbps is None else f"{cpu.mem_bandwidth_gbps:.1f} GB/s"
    rows.append(_row("memory bandwidth", bandwidth, src.get("mem_bandwidth_gbps", "")))
    return rows


def _gpu_rows(gpu: GpuCaps) -> list:
    src = gpu.sources
    features = gpu.features
    flags = [f.name for f in attrs.fields(type(features)) if getattr(features, f.name) is True]
    if features.fp8:
        flags.append(f"fp8={features.fp8}")
    bandwidth = None if gpu.mem_bandwidth_gbps is None else f"{gpu.mem_bandwidth_gbps:.0f} GB/s (peak)"
    driver = gpu.driver_version
    if gpu.driver_api_version:
        driver = f"{driver or '?'} (API {gpu.driver_api_version})"
    rows = [
        _row("name", gpu.name, src.get("name", "")),
        _row("arch", gpu.arch, src.get("arch", "")),
        _row("warp size", gpu.warp_size, src.get("warp_size", "")),
        _row("SMs / CUs", gpu.sm_count, src.get("sm_count", "")),
        _row("smem per block", None if gpu.smem_per_block is None else
             f"{gpu.smem_per_block} B ({_bytes(gpu.smem_per_block)})", src.get("smem_per_block", "")),
        _row("smem per block opt-in", None if gpu.smem_per_block_optin is None else
             f"{gpu.smem_per_block_optin} B ({_bytes(gpu.smem_per_block_optin)})",
             src.get("smem_per_block_optin", "")),
        _row("smem per SM", None if gpu.smem_per_sm is None else
             f"{gpu.smem_per_sm} B ({_bytes(gpu.smem_per_sm)})", src.get("smem_per_sm", "")),
        _row("registers per SM", gpu.regs_per_sm, src.get("regs_per_sm", "")),
        _row("registers per block", gpu.regs_per_block, src.get("regs_per_block", "")),
        _row("threads per SM", gpu.max_threads_per_sm, src.get("max_threads_per_sm", "")),
        _row("L2", None if gpu.l2_bytes is None else _bytes(gpu.l2_bytes), src.get("l2_bytes", "")),
        _row("memory", None if gpu.memory_bytes is None else _bytes(gpu.memory_bytes),
             src.get("memory_bytes", "")),
        _row("memory bandwidth", bandwidth, src.get("mem_bandwidth_gbps", "")),
        _row("driver", driver, src.get("driver_version", "")),
        _row("runtime", gpu.runtime_version, src.get("runtime_version", "")),
        _row("torch built for", " ".join(gpu.torch_archs) or None, src.get("torch_archs", "")),
        _row("features", " ".join(flags) or "none", src.get("features", "")),
    ]
    return rows


def _unknown_rows(unknown: dict) -> list:
    return [_row(f"  {name}", reason) for name, reason in sorted(unknown.items())]


def format_caps(caps: Caps) -> str:
    """The table `hal probe` prints; every value shows its source, every gap its reason."""
    if caps.profile:
        origin = f"profile {caps.profile}" + (" (synthetic, from datasheets)" if caps.synthetic else "")
    else:
        origin = "this machine" + (" (deep probe: torch/Triton asked)" if caps.deep else "")
    lines = [f"Capabilities of {origin}"]
    if caps.captured_on:
        lines.append(_row("captured on", caps.captured_on))
    lines.append("CPU")
    lines += _cpu_rows(caps.cpu)
    if caps.cpu.unknown:
        lines.append("  unknown:")
        lines += _unknown_rows(caps.cpu.unknown)
    for gpu in caps.gpus:
        lines.append(f"GPU {gpu.index} ({gpu.vendor or '?'})")
        lines += _gpu_rows(gpu)
        if gpu.unknown:
            lines.append("  unknown:")
            lines += _unknown_rows(gpu.unknown)
    if not caps.gpus:
        lines.append("GPUs: none found")
    if caps.unknown:
        lines.append("  other GPU vendors:" if caps.gpus else "  why:")
        lines += _unknown_rows(caps.unknown)
    for citation in caps.citations:
        lines.append(_row("cites", citation))
    return "\n".join(lines)
