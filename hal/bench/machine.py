"""What a benchmark can use on this machine: how many bytes of inputs fit in the memory that is
free now."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

# Inputs may take this share of the free memory: kernels, outputs, the reference's float
# temporaries and the ceilings' copy buffers need the rest.
INPUT_SHARE = 0.25


def _cpu_free_bytes() -> Optional[int]:
    """MemAvailable, lowered to the cgroup's remaining limit where one is set (containers)."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            left = int(limit) - used
            free = left if free is None else min(free, left)
    except (OSError, ValueError):
        pass
    return free


def free_bytes(device: str) -> Optional[int]:
    """Bytes free on `device` now, or None where the machine does not say."""
    if device == "cpu":
        return _cpu_free_bytes()
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def input_budget(device: str, ceiling: int) -> int:
    """Bytes a benchmark point may allocate for its inputs: `ceiling`, or INPUT_SHARE of the free
    memory where that is less."""
    free = free_bytes(device)
    return ceiling if free is None else min(ceiling, int(free * INPUT_SHARE))


def gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"
