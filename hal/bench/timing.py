"""How a kernel call is timed. CPU: wall clock around each call. GPU: a CUDA graph of one call per
rotated input set, replayed; when a kernel cannot be captured (it syncs with the host), CUDA events
around eager calls, and the result says so."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import attrs

# Enough repeats that the median is stable to a few percent on a quiet machine, few enough that a
# full token sweep of one model stays within minutes on 2 CPU cores.
DEFAULT_WARMUP = 3
DEFAULT_ITERS = 20
# A GPU replay shorter than this is dominated by launch jitter: replay the graph this long at least.
MIN_GPU_MEASURE_S = 0.02


@attrs.frozen
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    samples: int
    method: str  # wall | cuda_graph | cuda_events

    @classmethod
    def of(cls, seconds: Sequence[float], method: str) -> Timing:
        ordered = sorted(seconds)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
        return cls(statistics.median(ordered), pick(0.1), pick(0.9), len(ordered), method)


def time_cpu(calls: Sequence[Callable[[], object]], warmup: int = DEFAULT_WARMUP,
             iters: int = DEFAULT_ITERS) -> Timing:
    """Median seconds of one call, cycling through `calls` (one per rotated input set)."""
    for i in range(warmup):
        calls[i % len(calls)]()
    samples = []
    for i in range(iters):
        call = calls[i % len(calls)]
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return Timing.of(samples, "wall")


def capture_graph(calls):
    """The calls captured in order in one CUDA graph, after a first pass on the capture's side stream
    (which capture requires, and which compiles and allocates); raises where they cannot be captured."""
    import torch

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    stream.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    return graph


def _capture(calls):
    """The calls as one CUDA graph's replay, or None when they cannot be captured (a kernel that
    syncs with the host)."""
    import torch

    try:
        graph = capture_graph(calls)
    except Exception:
        torch.cuda.synchronize()
        return None
    return graph.replay


def time_gpu(calls: Sequence[Callable[[], object]], warmup: int = DEFAULT_WARMUP,
             iters: int = DEFAULT_ITERS, graph: bool = True) -> Timing:
    """graph=False times eager launches. The copy ceiling needs it: captured in a graph, torch's
    copy_ measured 2.7 TB/s on an H200, against the 4.2-4.3 TB/s recorded there for
    eager copies."""
    import torch

    for i in range(max(warmup, len(calls))):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    replay = _capture(calls) if graph else None
    method = "cuda_graph" if replay is not None else "cuda_events"
    if replay is None:
        def replay():
            for call in calls:
                call()
    replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    replay()
    stop.record()
    stop.synchronize()
    once = start.elapsed_time(stop) / 1e3
    repeats = max(1, int(MIN_GPU_MEASURE_S / max(once, 1e-7)))
    samples = []
    for _ in range(iters):
        start.record()
        for _ in range(repeats):
            replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1e3 / repeats / len(calls))
    return Timing.of(samples, method)


def time_calls(device: str, calls, warmup: int = DEFAULT_WARMUP, iters: int = DEFAULT_ITERS,
               graph: bool = True) -> Timing:
    return time_cpu(calls, warmup, iters) if device == "cpu" else time_gpu(calls, warmup, iters, graph)
