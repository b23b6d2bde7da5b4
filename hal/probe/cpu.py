"""CPU capabilities from /proc/cpuinfo, sysfs, the affinity mask, cgroups and arch_prctl.

Only files and two cheap syscalls: no subprocess, no sleep (py-cpuinfo's default path times the
clock for a second), no torch."""

from __future__ import annotations

import math
import os
from pathlib import Path

import attrs

from hal.caps import CpuCaps, IsaFlags
from hal.probe.amx import read_amx_state
from hal.probe.cache import read_cache_levels
from hal.probe.cgroup import read_cpu_quota
from hal.probe.cpulist import parse_cpu_list
from hal.probe.findings import Findings

PROC_CPUINFO = Path("/proc/cpuinfo")
SYSFS_CPU = Path("/sys/devices/system/cpu")
SYSFS_NODE = Path("/sys/devices/system/node")

# /proc/cpuinfo spells these flags exactly like the IsaFlags fields.
ISA_FLAG_NAMES = tuple(f.name for f in attrs.fields(IsaFlags))


def parse_cpuinfo(text: str) -> list:
    """/proc/cpuinfo -> one {key: value} dict per logical processor."""
    blocks, current = [], {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def isa_from_flags(flags: str) -> IsaFlags:
    present = set(flags.split())
    return IsaFlags(**{name: name in present for name in ISA_FLAG_NAMES})


def physical_cores_from_cpuinfo(blocks: list) -> int:
    """Unique (physical id, core id) pairs; x86 lists both for every logical CPU."""
    pairs = {(b["physical id"], b["core id"]) for b in blocks if "physical id" in b and "core id" in b}
    if not pairs:
        raise ValueError("/proc/cpuinfo lists no 'physical id' / 'core id' pairs")
    return len(pairs)


def _physical_cores_from_sysfs(cpus) -> int:
    pairs = set()
    for cpu in cpus:
        topology = SYSFS_CPU / f"cpu{cpu}" / "topology"
        pairs.add(((topology / "physical_package_id").read_text().strip(),
                   (topology / "core_id").read_text().strip()))
    return len(pairs)


def _int_field(block: dict, key: str):
    return int(block[key]) if key in block and block[key].lstrip("-").isdigit() else None


def _identity(found: Findings, blocks: list) -> None:
    first = blocks[0]
    found.found("vendor", first.get("vendor_id"), "proc")
    found.found("model_name", first.get("model name"), "proc")
    for field, key in (("family", "cpu family"), ("model", "model"), ("stepping", "stepping")):
        found.found(field, _int_field(first, key), "proc")
        found.missing(field, f"/proc/cpuinfo has no numeric '{key}' (not x86?)")
    for field in ("vendor", "model_name"):
        found.missing(field, "/proc/cpuinfo has no vendor_id / model name line (not x86?)")
    if "flags" in first:
        found.found("isa", isa_from_flags(first["flags"]), "proc")
    else:
        found.missing("isa", "/proc/cpuinfo has no 'flags' line (not x86?): all ISA flags read False")


def _topology(found: Findings, blocks: list) -> None:
    online = None
    with found.attempt("logical_cpus"):
        online = parse_cpu_list((SYSFS_CPU / "online").read_text())
        found.found("logical_cpus", len(online), "sysfs")
    if online:
        with found.attempt("physical_cores"):
            found.found("physical_cores", _physical_cores_from_sysfs(online), "sysfs")
    if not found.has("logical_cpus"):
        found.found("logical_cpus", os.cpu_count(), "os")
    if not found.has("physical_cores"):
        with found.attempt("physical_cores"):
            found.found("physical_cores", physical_cores_from_cpuinfo(blocks), "proc")
    with found.attempt("numa_nodes"):
        nodes = [p for p in SYSFS_NODE.glob("node[0-9]*") if p.name[4:].isdigit()]
        if nodes:
            found.found("numa_nodes", len(nodes), "sysfs")
        else:
            found.missing("numa_nodes", f"no {SYSFS_NODE}/node* entries (kernel without NUMA)")


def _usable_cpus(found: Findings) -> None:
    with found.attempt("usable_cpus"):
        affinity = len(os.sched_getaffinity(0))
        found.found("usable_cpus", affinity, "os")
    with found.attempt("usable_cpus"):
        quota = read_cpu_quota()
        if quota.cpus is not None:
            limit = max(1, math.ceil(quota.cpus))
            if limit < found.get("usable_cpus", limit + 1):
                found.found("usable_cpus", limit, "cgroup")


def probe_cpu() -> CpuCaps:
    """Never raises: every field that cannot be read is None with its reason in `unknown`."""
    found = Findings()
    blocks: list = []
    with found.attempt("vendor", "model_name", "family", "model", "stepping", "isa",
                       "physical_cores"):
        blocks = parse_cpuinfo(PROC_CPUINFO.read_text())
        if not blocks:
            raise ValueError(f"{PROC_CPUINFO} is empty")
        _identity(found, blocks)
    isa = found.get("isa", IsaFlags())
    with found.attempt("amx"):
        found.found("amx", read_amx_state(isa.amx_tile), "arch_prctl")
        found.sources["amx.cpuid"] = found.sources.get("isa", "proc")
    _topology(found, blocks)
    _usable_cpus(found)
    with found.attempt("caches"):
        found.found("caches", read_cache_levels(0), "sysfs")
    found.missing("mem_bandwidth_gbps", "not measured by default: hal probe --bandwidth measures it")
    return CpuCaps(**found.fields_of(CpuCaps), sources=found.sources, unknown=found.unknown)
