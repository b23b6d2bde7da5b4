"""cpu_brgemm and routing ids: -1 is no route; with check=False an id outside [-1, E) or a corrupt
expert_map value is skipped in the routing pass (the valid routes stay exact against the float64
reference, nothing outside out is written); with check=True such an id is a ValueError naming
topk_ids. Outputs are poisoned and framed by poisoned guard rows."""

from __future__ import annotations

import attrs
import pytest
import torch
from cpu_brgemm_helpers import check_against_reference, isa_params, machine_target, make_kernel, weights_for
from hal.backends.reference import ops as reference

from hal import synth
from hal.spec import MoESpec
from hal.testing import ACCURACY, rel_err

pytestmark = pytest.mark.cpu

E, TOP_K, H, I, M = 16, 4, 96, 64, 45
# Every kind of id a route can hold that is not an expert: dropped, just past the end, far past it,
# beyond int32 (int64 ids), and negative ones other than -1.
BAD_IDS = (E, E + 7, 2**30, -5, -(2**31))


def spec_for(ep: bool, fmt: str = "bf16") -> MoESpec:
    return MoESpec(num_experts=E, top_k=TOP_K, hidden_size=H, intermediate_size=I, weight_format=fmt,
                   num_local_experts=6 if ep else None)


def routing_with(spec, values, seed, every=3, dtype=torch.int32):
    """Fresh routing with `values` written over every `every`-th route, and token 1 with no route
    at all."""
    tw, ti = synth.random_routing(spec, M, seed=seed)
    ti = ti.to(dtype)
    flat = ti.view(-1)
    picks = torch.arange(0, flat.numel(), every)
    flat[picks] = torch.tensor(values, dtype=dtype)[torch.arange(picks.numel()) % len(values)]
    ti[1] = -1
    return tw, ti


def run_guarded(kernel, prepared, x, tw, ti, check):
    """Runs into rows 2..M+1 of a poisoned [M + 4, H] buffer; returns (out, guard rows)."""
    big = torch.full((M + 4, H), float("nan"), dtype=x.dtype)
    out = big[2:-2]
    assert kernel(x, tw, ti, prepared, out=out, check=check) is out
    return out, torch.cat([big[:2], big[-2:]])


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("ep", [False, True], ids=["no_ep", "ep"])
def test_dropped_routes_add_nothing(isa, ep):
    spec = spec_for(ep, "fp8_block128")
    weights = weights_for(spec, seed=1)
    kernel = make_kernel(spec, machine_target(), isa)
    prepared = kernel.prepare_weights(weights)
    x = synth.random_tokens(spec, M, seed=2)
    tw, ti = routing_with(spec, [-1], seed=3)
    out = check_against_reference(kernel, weights, prepared, x, tw, ti)
    assert torch.equal(out[1], torch.zeros_like(out[1])), "a token with no route must get zeros"
    # The oracle's meaning of -1, checked independently: the same route with weight 0.
    tw0, ti0 = tw.clone(), ti.clone()
    tw0[ti == -1], ti0[ti == -1] = 0.0, 0
    zero_weight = reference.moe_tokens(spec, x, tw0, ti0, weights, compute_dtype=torch.float64)
    assert rel_err(out, zero_weight) <= ACCURACY


@pytest.mark.parametrize("isa", isa_params())
def test_all_routes_dropped_gives_zeros(isa):
    spec = spec_for(False)
    kernel = make_kernel(spec, machine_target(), isa)
    prepared = kernel.prepare_weights(weights_for(spec, seed=4))
    x = synth.random_tokens(spec, M, seed=5)
    tw, ti = synth.random_routing(spec, M, seed=6)
    for check in (True, False):
        out, guards = run_guarded(kernel, prepared, x, tw, torch.full_like(ti, -1), check)
        assert torch.equal(out, torch.zeros_like(out))
        assert guards.isnan().all()
    assert kernel.plan(torch.full_like(ti, -1)).local_routes == 0


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("ep", [False, True], ids=["no_ep", "ep"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_out_of_range_ids_unchecked_are_no_route(isa, ep, dtype):
    spec = spec_for(ep)
    weights = weights_for(spec, seed=7)
    kernel = make_kernel(spec, machine_target(), isa)
    prepared = kernel.prepare_weights(weights)
    x = synth.random_tokens(spec, M, seed=8)
    bad = [-1, *BAD_IDS] + ([2**40, -(2**40), 2**32 + 3] if dtype == torch.int64 else [])
    tw, ti = routing_with(spec, bad, seed=9, dtype=dtype)
    out, guards = run_guarded(kernel, prepared, x, tw, ti, check=False)
    assert guards.isnan().all(), "a row outside out was written"
    assert not out.isnan().any(), "the kernel left output elements unwritten"
    # The valid routes alone, computed by the oracle with the bad ones replaced by weight-0 routes.
    valid = (ti >= 0) & (ti < E)
    ref = reference.moe_tokens(spec, x, torch.where(valid, tw, 0.0), torch.where(valid, ti, 0), weights,
                               compute_dtype=torch.float64)
    assert rel_err(out, ref) <= ACCURACY
    # 2**32 + 3 must not wrap to expert 3.
    assert rel_err(out, reference.moe_tokens(spec, x, tw, ti, weights, torch.float64)) <= ACCURACY
    with pytest.raises(ValueError, match=r"^topk_ids holds values in \[-?\d+, \d+\]: expected \[-1, 16\)"):
        kernel(x, tw, ti, prepared)


@pytest.mark.parametrize("isa", isa_params())
def test_corrupt_expert_map_unchecked_is_no_route(isa):
    """A prepared expert_map changed after validation (values past the local experts, below -1):
    those routes add nothing and no weight outside the local experts is read."""
    spec = spec_for(True)
    weights = weights_for(spec, seed=10)
    kernel = make_kernel(spec, machine_target(), isa)
    prepared = kernel.prepare_weights(weights)
    corrupt = weights.expert_map.clone()
    local = torch.nonzero(corrupt >= 0).flatten()
    corrupt[local[0]], corrupt[local[1]] = spec.local_experts, 1 << 30
    corrupt[torch.nonzero(corrupt == -1).flatten()[0]] = -7
    prepared.data.expert_map.copy_(corrupt)
    x = synth.random_tokens(spec, M, seed=11)
    tw, ti = synth.random_routing(spec, M, seed=12)
    out, guards = run_guarded(kernel, prepared, x, tw, ti, check=False)
    assert guards.isnan().all() and not out.isnan().any()
    ref = reference.moe_tokens(spec, x, tw, ti, attrs.evolve(weights, expert_map=corrupt),
                               compute_dtype=torch.float64)
    assert rel_err(out, ref) <= ACCURACY
    routed = ((ti == local[0]) | (ti == local[1])).any()
    assert bool(routed), "the routing should reach the corrupted experts"


@pytest.mark.parametrize("isa", isa_params())
def test_plan_counts_only_local_routes(isa):
    spec = spec_for(True)
    weights = weights_for(spec, seed=13)
    kernel = make_kernel(spec, machine_target(), isa)
    _, ti = routing_with(spec, [-1], seed=14)
    local = reference.local_ids(spec, ti, weights.expert_map)
    plan = kernel.plan(ti, weights.expert_map)
    assert plan.local_routes == int((local >= 0).sum())
    assert sorted({b.expert for b in plan.blocks}) == sorted(set(local[local >= 0].tolist()))
    for bad in BAD_IDS:
        with pytest.raises(ValueError, match=r"^topk_ids must hold"):
            kernel.plan(torch.full_like(ti, bad))
