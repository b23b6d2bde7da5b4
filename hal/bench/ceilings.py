"""The ceilings every figure is compared with, measured in the same run as the figure: memory
bandwidth (a large copy, bytes read plus written), the bf16 matrix rate (a large matmul) and, on a
GPU, the time of an empty kernel launch (the floor of anything tiny). Copy and matmul are measured
in several rounds: the rate is the median round's, and the spread (fastest round over slowest)
says whether the machine was quiet enough to trust a fraction of it."""

from __future__ import annotations

import statistics
import time
from typing import Optional

import attrs

from hal.bench.timing import time_calls

# Several times any last-level cache we target (EMR L3 up to 320 MB, H200 L2 60 MB), so the copy
# measures memory, not cache. The GPU copy is the size the H200's 4.3 TB/s was recorded at.
CPU_COPY_BYTES = 1 << 30
GPU_COPY_BYTES = 4 << 30
# An idle GPU clocks down (345 MHz seen on the H200); keep it busy this long before timing.
GPU_SPIN_UP_S = 0.3
# Launches per graph when timing an empty kernel, as many as a rotated benchmark replays.
EMPTY_LAUNCHES = 64
CPU_MATMUL_N = 2048  # large enough for oneDNN/AMX to reach its plateau on one socket in ~10 ms
# Where torch has no fast bf16 GEMM for the CPU (a scalar path: ~0.1-1 GFLOP/s), a 2048^3 matmul
# takes minutes; the size is then lowered so one call takes about this long.
CPU_MATMUL_TARGET_S = 0.05
CPU_MATMUL_PROBE_N = 256
GPU_MATMUL_N = 8192  # the size at which the H200's bf16 rate was recorded (708-790 TFLOP/s)
# Rounds per ceiling, and the samples in each: together about what one measurement took alone.
ROUNDS = 3
ROUND_ITERS = 4


@attrs.frozen
class Ceilings:
    device: str
    copy_gbps: float  # bytes read + written per second / 1e9
    bf16_tflops: float
    launch_us: Optional[float] = None  # an empty Triton kernel under graph replay (GPU only)
    copy_spread: float = 1.0  # the fastest round's rate over the slowest's (1.0: identical rounds)
    bf16_spread: float = 1.0

    def describe(self) -> str:
        launch = f", empty launch {self.launch_us:.2f} us" if self.launch_us is not None else ""
        return (f"ceilings on {self.device}, measured in this run ({ROUNDS} rounds, fastest/slowest): "
                f"copy {self.copy_gbps:.0f} GB/s ({self.copy_spread:.2f}x), bf16 matmul "
                f"{self.bf16_tflops:.3g} TFLOP/s ({self.bf16_spread:.2f}x){launch}")

    def floor_s(self, bytes_moved: float = 0.0, flops: float = 0.0) -> float:
        """The least time any kernel needs for this work here."""
        floor = max(bytes_moved / (self.copy_gbps * 1e9), flops / (self.bf16_tflops * 1e12))
        return max(floor, (self.launch_us or 0.0) * 1e-6)


def measure(device: str) -> Ceilings:
    cpu = device == "cpu"
    n = _cpu_matmul_n() if cpu else GPU_MATMUL_N
    copy_bytes = CPU_COPY_BYTES if cpu else GPU_COPY_BYTES
    copy = [2 * copy_bytes / s / 1e9 for s in _copy_seconds(device, copy_bytes)]
    matmul = [2 * n**3 / _matmul_seconds(device, n, iters=ROUND_ITERS) / 1e12 for _ in range(ROUNDS)]
    return Ceilings(device, statistics.median(copy), statistics.median(matmul),
                    None if cpu else _empty_launch_us(device), max(copy) / min(copy),
                    max(matmul) / min(matmul))


def _copy_seconds(device: str, nbytes: int) -> list:
    """The median seconds of one copy in each of ROUNDS rounds, on one pair of buffers."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    if device != "cpu":
        start = time.perf_counter()
        while time.perf_counter() - start < GPU_SPIN_UP_S:
            dst.copy_(src)
            torch.cuda.synchronize()
    return [time_calls(device, [lambda: dst.copy_(src)], warmup=2 if r == 0 else 0, iters=ROUND_ITERS,
                       graph=False).median_s for r in range(ROUNDS)]


def _empty_launch_us(device: str) -> Optional[float]:
    try:
        from hal.bench.empty_kernel import launch
    except ImportError:  # no Triton: the floor is bandwidth alone
        return None
    import torch

    scratch = torch.zeros(1, device=device)
    return time_calls(device, [lambda: launch(scratch)] * EMPTY_LAUNCHES, warmup=2, iters=10).median_s * 1e6


def _cpu_matmul_n() -> int:
    """CPU_MATMUL_N, or the size (a multiple of 128) at which one bf16 matmul takes about
    CPU_MATMUL_TARGET_S at the rate a small probe shows."""
    n = CPU_MATMUL_PROBE_N
    seconds = _matmul_seconds("cpu", n, warmup=1, iters=1)
    fitting = int((2 * n**3 / seconds * CPU_MATMUL_TARGET_S / 2) ** (1 / 3)) // 128 * 128
    return max(n, min(CPU_MATMUL_N, fitting))


def _matmul_seconds(device: str, n: int, warmup: int = 2, iters: int = 10) -> float:
    import torch

    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    return time_calls(device, [lambda: a @ b], warmup=warmup, iters=iters).median_s
