"""Whether a benchmark ran on a machine quiet enough to read its figures: the spread of the
ceilings across their rounds and the load on the CPUs the run may use, each against a threshold.
A figure above its ceiling (over 100% of the roofline) is the same symptom seen from a row."""

from __future__ import annotations

import os
from typing import Optional

# Ceiling rounds further apart than this (fastest over slowest) mean something else ran meanwhile.
NOISY_SPREAD = 1.25
# Runnable threads per usable CPU over the last minute, before the benchmark started.
NOISY_LOAD = 0.5


def load_per_cpu() -> Optional[float]:
    """The one-minute load average over the CPUs this process may run on, or None where the OS
    does not say."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return load / max(1, cpus or 1)


def warnings_for(ceilings, load: Optional[float], over_roofline: int = 0) -> tuple:
    """One line per sign of a noisy machine; () when there is none."""
    out = []
    for name, spread in (("copy", ceilings.copy_spread), ("bf16 matmul", ceilings.bf16_spread)):
        if spread > NOISY_SPREAD:
            out.append(f"the {name} ceiling varied {spread:.2f}x across its rounds (more than "
                       f"{NOISY_SPREAD:.2f}x): something else was running")
    if load is not None and load > NOISY_LOAD and ceilings.device == "cpu":
        out.append(f"the CPUs were already loaded ({load:.2f} runnable threads per CPU, more than "
                   f"{NOISY_LOAD}) before the run")
    if over_roofline:
        out.append(f"{over_roofline} row(s) ran faster than the ceilings allow (roof marked '>100%!'): "
                   "a ceiling was measured low, so no roof figure of this run is reliable")
    return tuple(out)
