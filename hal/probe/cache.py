"""CPU cache levels from /sys/devices/system/cpu/cpu<N>/cache/index*/.

A level is `per_core` when the logical CPUs sharing one instance are all SMT siblings of one core
(L1/L2 on most x86), otherwise `shared` (L3 across a CCX/die/socket). The CPU kernels size their
blocking from the per-core levels and their thread partitioning from the shared one."""

from __future__ import annotations

from pathlib import Path

from hal.caps import CacheLevel
from hal.probe.cpulist import parse_cpu_list, parse_size

SYSFS_CPU = Path("/sys/devices/system/cpu")
CACHE_KINDS = {"data": "data", "instruction": "instruction", "unified": "unified"}


def cache_scope(shared_cpu_list: str, core_siblings_list: str) -> tuple[int, str]:
    """(logical CPUs sharing the instance, 'per_core' | 'shared') from the two sysfs cpu lists.

    An empty shared list (some hypervisors leave it blank) counts as private to the core."""
    shared = parse_cpu_list(shared_cpu_list)
    siblings = parse_cpu_list(core_siblings_list)
    if not shared:
        return max(len(siblings), 1), "per_core"
    scope = "per_core" if shared <= siblings else "shared"
    return len(shared), scope


def read_cache_levels(cpu: int = 0, sysfs_cpu: Path = SYSFS_CPU) -> tuple:
    """The cache levels one logical CPU sees, ordered by level then kind."""
    cpu_dir = sysfs_cpu / f"cpu{cpu}"
    siblings_file = cpu_dir / "topology" / "thread_siblings_list"
    siblings = siblings_file.read_text() if siblings_file.exists() else str(cpu)
    levels = []
    for index in sorted((cpu_dir / "cache").glob("index[0-9]*")):
        kind = (index / "type").read_text().strip().lower()
        shared_file = index / "shared_cpu_list"
        shared_text = shared_file.read_text() if shared_file.exists() else ""
        shared_by, scope = cache_scope(shared_text, siblings)
        levels.append(CacheLevel(level=int((index / "level").read_text()),
                                 kind=CACHE_KINDS.get(kind, kind),
                                 size_bytes=parse_size((index / "size").read_text()),
                                 shared_by_cpus=shared_by, scope=scope))
    if not levels:
        raise FileNotFoundError(f"no cache entries under {cpu_dir / 'cache'}")
    return tuple(sorted(levels, key=lambda c: (c.level, c.kind)))
