"""The two ceilings every figure is compared with, measured in the same run as the figure: memory
bandwidth (a large copy, bytes read plus written) and the bf16 matrix rate (a large matmul)."""

from __future__ import annotations

import attrs

from hal.bench.timing import time_calls

# Several times any last-level cache we target (EMR L3 up to 320 MB, H200 L2 60 MB), so the copy
# measures memory, not cache.
COPY_BYTES = 1 << 30
CPU_MATMUL_N = 2048  # large enough for oneDNN/AMX to reach its plateau on one socket in ~10 ms
GPU_MATMUL_N = 8192  # the size at which the H200's bf16 rate was recorded (708-790 TFLOP/s)


@attrs.frozen
class Ceilings:
    device: str
    copy_gbps: float  # bytes read + written per second / 1e9
    bf16_tflops: float

    def describe(self) -> str:
        return (f"ceilings on {self.device}, measured in this run: copy {self.copy_gbps:.0f} GB/s, "
                f"bf16 matmul {self.bf16_tflops:.1f} TFLOP/s")


def measure(device: str) -> Ceilings:
    n = CPU_MATMUL_N if device == "cpu" else GPU_MATMUL_N
    return Ceilings(device, 2 * COPY_BYTES / _copy_seconds(device) / 1e9,
                    2 * n**3 / _matmul_seconds(device, n) / 1e12)


def _copy_seconds(device: str) -> float:
    import torch

    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return time_calls(device, [lambda: dst.copy_(src)], warmup=2, iters=10).median_s


def _matmul_seconds(device: str, n: int) -> float:
    import torch

    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    return time_calls(device, [lambda: a @ b], warmup=2, iters=10).median_s
