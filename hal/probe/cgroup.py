"""The CPU quota a cgroup puts on this process, as a number of CPUs (1.5 = 150 ms per 100 ms).

Containers often get all host CPUs in their affinity mask but a cpu.max quota of a few CPUs; sizing
a thread pool from the mask then oversubscribes and every thread stalls on throttling. The quota is
taken as the tightest limit on the path from this process's cgroup up to the mount root, for
cgroup v2 (cpu.max) and v1 (cpu.cfs_quota_us / cpu.cfs_period_us)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import attrs

PROC_SELF_CGROUP = Path("/proc/self/cgroup")
PROC_SELF_MOUNTINFO = Path("/proc/self/mountinfo")


def parse_cpu_max(text: str) -> Optional[float]:
    """cgroup v2 cpu.max: 'max 100000' -> None (no limit); '150000 100000' -> 1.5 CPUs."""
    fields = text.split()
    if len(fields) not in (1, 2):
        raise ValueError(f"cpu.max {text!r}: expected '<quota|max> [period]'")
    if fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) == 2 else 100_000  # the kernel's default period, in us
    return _ratio(int(fields[0]), period, "cpu.max")


def parse_cfs_quota(quota_text: str, period_text: str) -> Optional[float]:
    """cgroup v1: cpu.cfs_quota_us '-1' -> None (no limit); '200000' over '100000' -> 2.0 CPUs."""
    quota = int(quota_text.strip())
    if quota < 0:
        return None
    return _ratio(quota, int(period_text.strip()), "cpu.cfs_quota_us")


def _ratio(quota: int, period: int, what: str) -> float:
    if quota <= 0 or period <= 0:
        raise ValueError(f"{what}: quota {quota} / period {period}, expected positive numbers")
    return quota / period


@attrs.frozen
class Mount:
    root: str  # the path inside the cgroup hierarchy that this mount shows
    mount_point: str
    fstype: str
    super_options: frozenset


def parse_mountinfo(text: str) -> list:
    """The cgroup and cgroup2 mounts of /proc/self/mountinfo."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(Mount(root=fields[3], mount_point=fields[4], fstype=tail[0],
                            super_options=frozenset(tail[2].split(","))))
    return mounts


def parse_proc_cgroup(text: str) -> dict:
    """/proc/self/cgroup -> {controller: path}; the v2 unified hierarchy is under key ''."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def _cgroup_dirs(mount: Mount, cgroup_path: str) -> list:
    """Directories from this process's cgroup up to the mount point, deepest first."""
    base = Path(mount.mount_point)
    relative = cgroup_path
    if mount.root != "/" and cgroup_path.startswith(mount.root):
        relative = cgroup_path[len(mount.root):]
    elif mount.root != "/":
        relative = "/"  # a namespaced view whose root we cannot place: only the mount itself applies
    leaf = base / relative.lstrip("/")
    dirs = [leaf]
    while dirs[-1] != base and base in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


@attrs.frozen
class CpuQuota:
    cpus: Optional[float]  # None: no quota anywhere on the path
    where: str  # the file that set the limit, or what was searched


def read_cpu_quota(proc_cgroup: Path = PROC_SELF_CGROUP,
                   mountinfo: Path = PROC_SELF_MOUNTINFO) -> CpuQuota:
    """The tightest cpu quota over v2 and v1 hierarchies that apply to this process."""
    paths = parse_proc_cgroup(proc_cgroup.read_text())
    best: Optional[float] = None
    where = "no cpu.max / cpu.cfs_quota_us limit on this process's cgroup path"
    for mount in parse_mountinfo(mountinfo.read_text()):
        if mount.fstype == "cgroup2" and "" in paths:
            candidates = [(d / "cpu.max", None) for d in _cgroup_dirs(mount, paths[""])]
        elif mount.fstype == "cgroup" and "cpu" in mount.super_options and "cpu" in paths:
            candidates = [(d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us")
                          for d in _cgroup_dirs(mount, paths["cpu"])]
        else:
            continue
        for quota_file, period_file in candidates:
            if not quota_file.exists():
                continue
            if period_file is None:
                cpus = parse_cpu_max(quota_file.read_text())
            else:
                cpus = parse_cfs_quota(quota_file.read_text(), period_file.read_text())
            if cpus is not None and (best is None or cpus < best):
                best, where = cpus, str(quota_file)
    return CpuQuota(cpus=best, where=where)
