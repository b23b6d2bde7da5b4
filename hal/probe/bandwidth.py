"""Measured CPU memory bandwidth: a large tensor copy on every usable thread.

Not part of the default probe (it takes about a second and imports torch). `hal probe --bandwidth`
and the benchmarks call it to turn a roofline fraction into a measured number."""

from __future__ import annotations

import statistics
import time

import attrs

from hal.caps import Caps

COPY_BYTES = 1 << 30  # 1 GiB per buffer: far beyond any L3, so the copy streams from DRAM
COPY_REPEATS = 5  # the median of five copies steadies the result against one noisy sample
WARMUP_COPIES = 1  # the first copy also faults in the destination pages


def measure_memory_bandwidth(size_bytes: int = COPY_BYTES, repeats: int = COPY_REPEATS,
                             threads: int = 0) -> float:
    """GB/s (1e9 bytes/s) of dst.copy_(src), counting the read and the write; `threads` 0 = usable CPUs."""
    if size_bytes <= 0:
        raise ValueError(f"size_bytes={size_bytes}: expected a positive byte count")
    if repeats <= 0:
        raise ValueError(f"repeats={repeats}: expected a positive count")
    import torch

    from hal.probe.cpu import probe_cpu

    wanted = threads or probe_cpu().usable_cpus or torch.get_num_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(wanted)
    try:
        src = torch.ones(size_bytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        for _ in range(WARMUP_COPIES):
            dst.copy_(src)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            seconds.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return 2 * size_bytes / statistics.median(seconds) / 1e9


def with_measured_bandwidth(caps: Caps, **kwargs) -> Caps:
    """`caps` with cpu.mem_bandwidth_gbps measured on this machine (source "measured")."""
    gbps = round(measure_memory_bandwidth(**kwargs), 1)
    unknown = {k: v for k, v in caps.cpu.unknown.items() if k != "mem_bandwidth_gbps"}
    cpu = attrs.evolve(caps.cpu, mem_bandwidth_gbps=gbps, unknown=unknown,
                       sources={**caps.cpu.sources, "mem_bandwidth_gbps": "measured"})
    return attrs.evolve(caps, cpu=cpu)
