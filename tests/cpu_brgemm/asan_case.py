"""cpu_brgemm built with AddressSanitizer, run on routing ids that are not experts (-1, E, E + 7,
2**30, -5, int64-wide ones) and through a corrupt expert_map, with check=False.
test_cpu_brgemm_asan.py runs this file in a process with libasan preloaded: ASan ends the process
on any out-of-bounds access; the exit status is non-zero also when the valid routes are not exact
against the float64 reference."""

from __future__ import annotations

import sys

import attrs
import torch
from hal.backends.cpu_brgemm import extension
from hal.backends.cpu_brgemm.kernel import CpuBrgemmKernel
from hal.backends.reference import ops as reference

from hal import synth
from hal.backend import Target
from hal.spec import MoESpec
from hal.testing import ACCURACY, live_cpu_caps, rel_err


class AsanKernel(CpuBrgemmKernel):
    @property
    def ops(self):
        return extension.ops(self.isa, sanitizer="address")


def bad_routing(spec, M, seed):
    E = spec.num_experts
    tw, ti = synth.random_routing(spec, M, seed=seed)
    ti = ti.long()
    bad = torch.tensor([-1, E, E + 7, 2**30, -5, 2**40, -(2**40), 2**32 + 3])
    flat = ti.view(-1)
    picks = torch.arange(0, flat.numel(), 3)
    flat[picks] = bad[torch.arange(picks.numel()) % bad.numel()]
    ti[1] = -1
    return tw, ti


def check_case(spec, isa, seed, corrupt_map) -> float:
    weights = synth.random_weights(spec, seed=seed)
    if spec.is_ep:
        weights = attrs.evolve(weights, expert_map=synth.random_expert_map(spec, seed=seed + 1))
    kernel = AsanKernel(spec, Target("cpu", live_cpu_caps()), isa=isa)
    prepared = kernel.prepare_weights(weights)
    if corrupt_map:
        corrupt = weights.expert_map.clone()
        local = torch.nonzero(corrupt >= 0).flatten()
        corrupt[local[0]], corrupt[local[1]] = spec.local_experts, 1 << 30
        corrupt[torch.nonzero(corrupt == -1).flatten()[0]] = -7
        prepared.data.expert_map.copy_(corrupt)
        weights = attrs.evolve(weights, expert_map=corrupt)
    M = 41
    x = synth.random_tokens(spec, M, seed=seed + 2)
    tw, ti = bad_routing(spec, M, seed + 3)
    for dtype in (torch.int64, torch.int32):
        ids = ti if dtype == torch.int64 else ti.clamp(-(2**31), 2**31 - 1).to(torch.int32)
        out = torch.full_like(x, float("nan"))
        kernel(x, tw, ids, prepared, out=out, check=False)
        valid = (ids >= 0) & (ids < spec.num_experts)
        ref = reference.moe_tokens(spec, x, torch.where(valid, tw, 0.0), torch.where(valid, ids, 0), weights,
                                   compute_dtype=torch.float64)
        err = rel_err(out, ref)
        print(f"{isa} ep={spec.is_ep} corrupt_map={corrupt_map} {dtype}: rel err {err:.3g}")
        if not err <= ACCURACY:
            return err
    return 0.0


def main() -> int:
    isa = sys.argv[1]
    worst = 0.0
    for fmt, ep, corrupt_map in (("bf16", False, False), ("fp8_block128", True, False),
                                 ("mxfp4", True, True)):
        spec = MoESpec(num_experts=16, top_k=4, hidden_size=64, intermediate_size=64, weight_format=fmt,
                       activation="swiglu_oai" if fmt == "mxfp4" else "silu",
                       num_local_experts=6 if ep else None)
        worst = max(worst, check_case(spec, isa, seed=len(fmt), corrupt_map=corrupt_map))
    return 0 if worst <= ACCURACY else 1


if __name__ == "__main__":
    sys.exit(main())
