"""Shared helpers of the cpu_brgemm tests: the machine's target, the ISA builds it can run, and one
checked run of the kernel against the float64 reference."""

from __future__ import annotations

import attrs
import pytest
import torch
from hal.backends.reference import ops as reference

from hal import synth
from hal.backend import Target
from hal.testing import ACCURACY, live_cpu_caps, rel_err


def this_machine():
    return live_cpu_caps()


def runnable_isas():
    """ISA builds this CPU executes: always avx2 (where present), avx512bf16 where the CPU has it."""
    isa = this_machine().cpu.isa
    out = []
    if isa.avx2 and isa.fma:
        out.append("avx2")
    if isa.avx512 and isa.avx512_bf16:
        out.append("avx512bf16")
    return out


def isa_params():
    """Both builds; the one this CPU cannot run is skipped with the reason."""
    return [pytest.param("avx2", id="avx2"),
            pytest.param("avx512bf16", id="avx512bf16", marks=pytest.mark.avx512)]


def machine_target():
    return Target("cpu", this_machine())


def make_kernel(spec, target, isa, policy="per_block"):
    from hal.backends.cpu_brgemm.kernel import CpuBrgemmKernel

    if isa not in runnable_isas():
        pytest.skip(f"this CPU cannot run the {isa} build")
    return CpuBrgemmKernel(spec, target, policy=policy, isa=isa)


def check_against_reference(kernel, weights, prepared, x, topk_weights, topk_ids):
    """Runs into a poisoned out= tensor and checks every element was written and the result is
    within ACCURACY of the float64 reference; returns the output."""
    spec = kernel.spec
    out = torch.full_like(x, float("nan"))  # poison: unwritten elements stay NaN
    got = kernel(x, topk_weights, topk_ids, prepared, out=out)
    assert got is out
    assert not torch.isnan(out).any(), "the kernel left output elements unwritten"
    ref = reference.moe_tokens(spec, x, topk_weights, topk_ids, weights, compute_dtype=torch.float64)
    err = rel_err(out, ref)
    assert err <= ACCURACY, f"rel err {err:.3e} > {ACCURACY} ({kernel.policy}, {kernel.isa})"
    return out


def weights_for(spec, seed=0):
    weights = synth.random_weights(spec, seed=seed)
    if spec.is_ep:
        weights = attrs.evolve(weights, expert_map=synth.random_expert_map(spec, seed=seed + 1))
    return weights
