"""A small EP + bias Marlin layer, run once; test_marlin_cuda.py runs this file under
compute-sanitizer memcheck. Exits non-zero when the output is wrong. The last call routes -1,
out-of-range and int64-wide ids with check=False, through an expert_map with corrupt values (as in
test_marlin_routing_ids.py), so memcheck also sees that no bad id reads or writes out of bounds."""

from __future__ import annotations

import sys

import attrs
import torch
from hal.backends.marlin.kernel import MarlinMoEKernel
from hal.backends.reference import ops

import hal
from hal.backend import Target
from hal.synth import random_expert_map, random_routing, random_tokens, random_weights


def main() -> int:
    spec = hal.MoESpec(32, 4, 256, 128, "int4_g128", "swiglu_oai", has_bias=True, num_local_experts=12)
    kernel = MarlinMoEKernel(spec, Target("cuda:0", hal.probe(deep=True)))
    w = random_weights(spec, device="cuda", seed=1)
    w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=2, device="cuda"))
    prepared = kernel.prepare_weights(w)
    worst = 0.0
    for m in (1, 5, 70, 300):  # decode (split K, atomics) and multi-block batches
        x = random_tokens(spec, m, seed=m, device="cuda")
        tw, ti = random_routing(spec, m, seed=m + 1, device="cuda")
        out = kernel(x, tw, ti, prepared)
        ref = ops.moe_tokens(spec, x, tw, ti, w, compute_dtype=torch.float64).double()
        err = float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))
        worst = max(worst, err)
    worst = max(worst, bad_routes_case(kernel, spec, w, prepared))
    torch.cuda.synchronize()
    print(f"memcheck case: worst rel err {worst:.3g}")
    return 0 if worst <= 1e-2 else 1


def bad_routes_case(kernel, spec, w, prepared) -> float:
    E = spec.num_experts
    corrupt = w.expert_map.clone()
    local = torch.nonzero(corrupt >= 0).flatten()
    corrupt[local[0]], corrupt[local[1]] = spec.local_experts, -7
    prepared.data.expert_map.copy_(corrupt)
    x = random_tokens(spec, 33, seed=3, device="cuda")
    tw, ti = random_routing(spec, 33, seed=4, device="cuda")
    ti = ti.long()
    ti.view(-1)[::3] = torch.tensor([-1, E, E + 7, 2**30, -5, 2**40, 2**32 + 3],
                                    device="cuda").repeat(7)[: ti.view(-1)[::3].numel()]
    out = kernel(x, tw, ti, prepared, check=False)
    valid = (ti >= 0) & (ti < E)
    ref = ops.moe_tokens(spec, x, torch.where(valid, tw, 0.0), torch.where(valid, ti, 0),
                         attrs.evolve(w, expert_map=corrupt), compute_dtype=torch.float64).double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


if __name__ == "__main__":
    sys.exit(main())
