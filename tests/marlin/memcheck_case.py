"""A small EP + bias Marlin layer, run once; test_marlin_cuda.py runs this file under
compute-sanitizer memcheck. Exits non-zero when the output is wrong."""

from __future__ import annotations

import sys

import attrs
import torch

import hal
from backends.marlin.kernel import MarlinMoEKernel
from backends.reference import ops
from hal.backend import Target
from hal.synth import random_expert_map, random_routing, random_tokens, random_weights


def main() -> int:
    spec = hal.MoESpec(32, 4, 256, 128, "int4_g128", "swiglu_oai", has_bias=True, num_local_experts=12)
    kernel = MarlinMoEKernel(spec, Target("cuda:0", hal.probe(deep=True)))
    w = random_weights(spec, device="cuda", seed=1)
    w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=2, device="cuda"))
    prepared = kernel.prepare_weights(w)
    worst = 0.0
    for m in (1, 5, 70):  # decode (split K, atomics) and a multi-block batch
        x = random_tokens(spec, m, seed=m, device="cuda")
        tw, ti = random_routing(spec, m, seed=m + 1, device="cuda")
        out = kernel(x, tw, ti, prepared)
        ref = ops.moe_tokens(spec, x, tw, ti, w, compute_dtype=torch.float64).double()
        err = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
        worst = max(worst, err)
    torch.cuda.synchronize()
    print(f"memcheck case: worst rel err {worst:.3g}")
    return 0 if worst <= 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
