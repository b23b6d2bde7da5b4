"""Fixed cost of one cpu_brgemm call on cold caches: a qwen3-30b-a3b fp8 layer (8 experts) called on
one token whose every route is dropped (ids -1: the Python call, the dispatcher, the op's checks
and the routing pass, no GEMM), beside plain torch ops on tensors of the same size, each after a
write of --flush-mib of memory (cold) or not (warm). This is the part of a 1-token decode call that
no weight stream explains (docs/backends/cpu_brgemm.md, against the floor).

    python benchmarks/cpu_brgemm_call_overhead.py [--threads 16] [--calls 40]"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import hal
from hal.presets import PRESETS


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--calls", type=int, default=40, help="calls per case; the first 5 are not counted")
    parser.add_argument("--flush-mib", type=int, default=1024)
    args = parser.parse_args()
    from cpu_moe_peer import checkpoint_weights, input_sets

    torch.set_num_threads(args.threads)
    spec = PRESETS["qwen3-30b-a3b"].spec("fp8_block128", num_experts=8)
    kernel = hal.select_moe_kernel(spec, "cpu", prefer="cpu_brgemm")
    prepared = kernel.prepare_weights(checkpoint_weights(spec))
    flush = torch.empty(args.flush_mib << 18, dtype=torch.float32)
    x, tw, ti, out = input_sets(spec, 1, 1)[0]
    dropped = torch.full_like(ti, -1)
    cases = {"cpu_brgemm, 1 token, every route dropped": lambda: kernel(x, tw, dropped, prepared, out=out,
                                                                         check=False),
             "torch.Tensor.zero_ on the 1 x 2048 output": lambda: out.zero_(),
             "torch.add of two 1 x 2048 bf16 rows": lambda: torch.add(x, x, out=out)}
    print(f"# {hal.probe().cpu.model_name}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| call | caches | median us |\n| --- | --- | --- |")
    for name, call in cases.items():
        for cold in (False, True):
            times = []
            for i in range(args.calls):
                if cold:
                    flush.fill_(i)
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e6)
            caches = "cold" if cold else "warm"
            print(f"| {name} | {caches} | {statistics.median(times[5:]):.1f} |", flush=True)


if __name__ == "__main__":
    main()
