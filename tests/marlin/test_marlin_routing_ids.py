"""Marlin and routing ids on an NVIDIA GPU: -1 is no route; with check=False an id outside [-1, E)
or a corrupt expert_map value is left out by the routing kernel (the valid routes stay exact
against the float64 reference, nothing outside out is written); with check=True such an id is a
ValueError naming topk_ids. memcheck_case.py runs the same inputs under compute-sanitizer."""

from __future__ import annotations

import functools

import attrs
import pytest
import torch
from hal.backends.marlin import configs
from hal.backends.marlin.kernel import MarlinMoEKernel
from hal.backends.reference import ops

import hal
from hal.backend import Target
from hal.synth import random_expert_map, random_routing, random_tokens, random_weights
from hal.testing import ACCURACY, rel_err

pytestmark = pytest.mark.cuda

DEVICE = "cuda:0"
M = 37
NO_EP = hal.MoESpec(16, 4, 256, 128, "int4_g128")
EP = hal.MoESpec(32, 4, 256, 128, "int4_g128", "swiglu_oai", has_bias=True, num_local_experts=12)
SPECS = {"no_ep": NO_EP, "ep": EP}


def bad_ids(spec, dtype):
    wide = [2**40, -(2**40), 2**32 + 3] if dtype == torch.int64 else []
    return [-1, spec.num_experts, spec.num_experts + 7, 2**30, -5, -(2**31), *wide]


@functools.cache
def target() -> Target:
    return Target(DEVICE, hal.probe(deep=True))


def setup(spec, seed):
    kernel = MarlinMoEKernel(spec, target())
    w = random_weights(spec, device=DEVICE, seed=seed)
    if spec.is_ep:
        w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=seed + 1, device=DEVICE))
    x = random_tokens(spec, M, seed=seed + 2, device=DEVICE)
    return kernel, w, kernel.prepare_weights(w), x


def routing_with(spec, values, seed, dtype=torch.int32):
    """Fresh routing with `values` over every third route, and token 1 with no route at all."""
    tw, ti = random_routing(spec, M, seed=seed, device=DEVICE)
    ti = ti.to(dtype)
    flat = ti.view(-1)
    picks = torch.arange(0, flat.numel(), 3, device=DEVICE)
    table = torch.tensor(values, dtype=dtype, device=DEVICE)
    flat[picks] = table[torch.arange(picks.numel(), device=DEVICE) % len(values)]
    ti[1] = -1
    return tw, ti


def run_guarded(kernel, prepared, x, tw, ti, check):
    """Runs into rows 2..M+1 of a NaN [M + 4, H] buffer; returns (out, guard rows)."""
    big = torch.full((M + 4, x.shape[1]), float("nan"), dtype=x.dtype, device=DEVICE)
    out = big[2:-2]
    kernel(x, tw, ti, prepared, out=out, check=check)
    torch.cuda.synchronize()
    return out, torch.cat([big[:2], big[-2:]])


def oracle_of_valid_routes(spec, x, tw, ti, w):
    valid = (ti >= 0) & (ti < spec.num_experts)
    return ops.moe_tokens(spec, x, torch.where(valid, tw, 0.0), torch.where(valid, ti, 0), w,
                          compute_dtype=torch.float64)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_dropped_and_out_of_range_ids_unchecked(name, dtype):
    spec = SPECS[name]
    kernel, w, prepared, x = setup(spec, seed=1)
    tw, ti = routing_with(spec, bad_ids(spec, dtype), seed=4, dtype=dtype)
    out, guards = run_guarded(kernel, prepared, x, tw, ti, check=False)
    assert guards.isnan().all(), "a row outside out was written"
    assert not out.isnan().any(), "an output element was never written"
    assert rel_err(out, oracle_of_valid_routes(spec, x, tw, ti, w)) <= ACCURACY
    assert torch.equal(out[1], torch.zeros_like(out[1])), "a token with no route must get zeros"
    with pytest.raises(ValueError, match=r"^topk_ids holds values in .*: expected \[-1, "):
        kernel(x, tw, ti, prepared)


@pytest.mark.parametrize("name", list(SPECS))
def test_dropped_routes_checked(name):
    spec = SPECS[name]
    kernel, w, prepared, x = setup(spec, seed=5)
    tw, ti = routing_with(spec, [-1], seed=6)
    out, guards = run_guarded(kernel, prepared, x, tw, ti, check=True)
    assert guards.isnan().all() and not out.isnan().any()
    assert rel_err(out, ops.moe_tokens(spec, x, tw, ti, w, compute_dtype=torch.float64)) <= ACCURACY


@pytest.mark.parametrize("name", list(SPECS))
def test_all_routes_dropped_gives_zeros(name):
    spec = SPECS[name]
    kernel, _, prepared, x = setup(spec, seed=7)
    tw, ti = random_routing(spec, M, seed=8, device=DEVICE)
    out, guards = run_guarded(kernel, prepared, x, tw, torch.full_like(ti, -1), check=False)
    assert torch.equal(out, torch.zeros_like(out)) and guards.isnan().all()


@pytest.mark.parametrize("name", list(SPECS))
def test_corrupt_expert_map_unchecked(name):
    """An expert_map changed after prepare_weights validated it: values past the local experts,
    below -1, and (in the build without EP) -1 add nothing and read no weight."""
    spec = SPECS[name]
    kernel, w, prepared, x = setup(spec, seed=9)
    if prepared.data.expert_map is None:  # the build without EP, given an identity map
        w = attrs.evolve(w, expert_map=torch.arange(spec.num_experts, dtype=torch.int32, device=DEVICE))
        prepared = kernel.prepare_weights(w)
    corrupt = prepared.data.expert_map.clone()
    local = torch.nonzero(corrupt >= 0).flatten()
    corrupt[local[0]], corrupt[local[1]], corrupt[local[2]] = spec.local_experts, 1 << 30, -7
    if not spec.is_ep:
        corrupt[local[3]] = -1
    prepared.data.expert_map.copy_(corrupt)
    tw, ti = random_routing(spec, M, seed=10, device=DEVICE)
    out, guards = run_guarded(kernel, prepared, x, tw, ti, check=False)
    assert guards.isnan().all() and not out.isnan().any()
    ref = ops.moe_tokens(spec, x, tw, ti, attrs.evolve(w, expert_map=corrupt), compute_dtype=torch.float64)
    assert rel_err(out, ref) <= ACCURACY


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_route_op_leaves_bad_ids_out(dtype):
    spec = EP
    kernel, w, _, _ = setup(spec, seed=11)
    _, ti = routing_with(spec, bad_ids(spec, dtype), seed=12, dtype=dtype)
    block_m = configs.BLOCK_M_CHOICES[0]
    sorted_routes, block_expert, num_blocks, route_expert = kernel.loaded_ops().route(
        ti, w.expert_map, spec.num_experts, block_m)
    n, routes = int(num_blocks), ti.numel()
    flat = ti.view(-1).cpu()
    valid = (flat >= 0) & (flat < spec.num_experts)
    seen = sorted_routes[: n * block_m].cpu()
    assert sorted(seen[seen < routes].tolist()) == torch.nonzero(valid).flatten().tolist()
    want = torch.where(valid, w.expert_map.cpu()[flat.clamp(0, spec.num_experts - 1).long()], -1)
    assert torch.equal(route_expert.cpu(), want.to(torch.int32))
    assert ((block_expert[:n].cpu() >= -1) & (block_expert[:n].cpu() < spec.local_experts)).all()
