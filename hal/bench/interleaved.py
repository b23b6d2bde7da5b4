"""Side-by-side timing for the peer benchmarks: several sides (a backend, a peer kernel, the rule's
alternative), each a list of calls, one per rotated input set, timed in alternation so drift in
clocks or temperature lands on every side alike. GPU: each side's calls captured in one CUDA graph,
each sample replays it for at least `min_sample_s`; CPU: wall clock around the calls."""

from __future__ import annotations

import math
import statistics
import time

import torch

from hal.bench.timing import capture_graph


def time_sides(sides: dict, iters: int, device: str, min_sample_s: float) -> dict:
    """{name: median seconds per call}, samples alternating between the sides."""
    if device == "cpu":
        samples = {name: [] for name in sides}
        for _ in range(iters):
            for name, calls in sides.items():
                start = time.perf_counter()
                for call in calls:
                    call()
                samples[name].append((time.perf_counter() - start) / len(calls))
        return {name: statistics.median(s) for name, s in samples.items()}
    graphs = {name: capture_graph(calls) for name, calls in sides.items()}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    repeats = {}
    for name, graph in graphs.items():
        graph.replay()
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        repeats[name] = max(1, math.ceil(min_sample_s / max(start.elapsed_time(stop) / 1e3, 1e-7)))
    samples = {name: [] for name in graphs}
    for _ in range(iters):
        for name, graph in graphs.items():
            start.record()
            for _ in range(repeats[name]):
                graph.replay()
            stop.record()
            stop.synchronize()
            samples[name].append(start.elapsed_time(stop) / 1e3 / repeats[name] / len(sides[name]))
    return {name: statistics.median(s) for name, s in samples.items()}
