"""The routing-id contract as the oracle defines it and the validation enforces it: -1 is no route;
an id outside [-1, E) is a ValueError naming topk_ids with check=True and no route with check=False;
an expert_map holds each local id at most once, values in [-1, local_experts)."""

from __future__ import annotations

import attrs
import pytest
import torch
from hal.backends.reference import ops
from hal.backends.reference.kernels import ReferenceMoEKernel

import hal
from hal.backend import Target
from hal.caps import Caps
from hal.synth import random_expert_map, random_routing, random_tokens, random_weights
from hal.testing import ACCURACY, poison, rel_err
from hal.weights_check import check_expert_map

pytestmark = pytest.mark.cpu

E, M = 12, 19
SPEC = hal.MoESpec(num_experts=E, top_k=3, hidden_size=64, intermediate_size=32)
EP_SPEC = hal.MoESpec(num_experts=E, top_k=3, hidden_size=64, intermediate_size=32,
                      num_local_experts=5)
BAD_IDS = (E, E + 7, 2**30, -5, -(2**31))


def weights_for(spec, seed):
    w = random_weights(spec, seed=seed)
    return attrs.evolve(w, expert_map=random_expert_map(spec, seed=seed + 1)) if spec.is_ep else w


def as_zero_weight(tw, ti, drop):
    """The same routing with the routes in `drop` turned into weight-0 routes to expert 0."""
    return torch.where(drop, 0.0, tw), torch.where(drop, 0, ti)


@pytest.mark.parametrize("spec", [SPEC, EP_SPEC], ids=["no_ep", "ep"])
def test_oracle_no_route_equals_a_zero_weight_route(spec):
    w = weights_for(spec, seed=1)
    x = random_tokens(spec, M, seed=2)
    tw, ti = random_routing(spec, M, seed=3)
    ti.view(-1)[::4] = -1
    ti.view(-1)[1::7] = torch.tensor(BAD_IDS, dtype=torch.int32).repeat(4)[: ti.view(-1)[1::7].numel()]
    ti[0] = -1
    got = ops.moe_tokens(spec, x, tw, ti, w, compute_dtype=torch.float64)
    want = ops.moe_tokens(spec, x, *as_zero_weight(tw, ti, (ti < 0) | (ti >= E)), w,
                          compute_dtype=torch.float64)
    assert torch.equal(got, want)
    assert torch.equal(got[0], torch.zeros_like(got[0]))


def test_local_ids_drop_bad_ids_and_map_values():
    expert_map = torch.tensor([-1, 0, 7, 1, -9] + [-1] * (E - 5), dtype=torch.int32)  # 7, -9 corrupt
    ids = torch.tensor([[0, 1, 2], [3, 4, -1], [E, -7, 2**30]], dtype=torch.int64)
    local = ops.local_ids(EP_SPEC, ids, expert_map)
    assert local.tolist() == [[-1, 0, -1], [1, -1, -1], [-1, -1, -1]]
    assert ops.local_ids(SPEC, ids, None).tolist() == [[0, 1, 2], [3, 4, -1], [-1, -1, -1]]


@pytest.mark.parametrize("spec", [SPEC, EP_SPEC], ids=["no_ep", "ep"])
def test_reference_kernel_ids_checked_and_unchecked(spec):
    kernel = ReferenceMoEKernel(spec, Target("cpu", Caps()))
    w = weights_for(spec, seed=4)
    prepared = kernel.prepare_weights(w)
    x = random_tokens(spec, M, seed=5)
    tw, ti = random_routing(spec, M, seed=6)
    ti[2, 1] = -1
    out = kernel(x, tw, ti, prepared, out=poison(torch.empty_like(x)))  # -1 passes validation
    assert rel_err(out, ops.moe_tokens(spec, x, tw, ti, w, torch.float64)) <= ACCURACY
    for bad in BAD_IDS:
        bad_ti = ti.clone()
        bad_ti[3, 0] = bad
        with pytest.raises(ValueError, match=rf"^topk_ids holds values in .*: expected \[-1, {E}\)"):
            kernel(x, tw, bad_ti, prepared)
        out = kernel(x, tw, bad_ti, prepared, out=poison(torch.empty_like(x)), check=False)
        want = ops.moe_tokens(spec, x, *as_zero_weight(tw, bad_ti, bad_ti.eq(bad)), w, torch.float64)
        assert rel_err(out, want) <= ACCURACY


def test_non_local_routes_add_nothing():
    kernel = ReferenceMoEKernel(EP_SPEC, Target("cpu", Caps()))
    w = weights_for(EP_SPEC, seed=7)
    remote = torch.nonzero(w.expert_map < 0).flatten()
    x = random_tokens(EP_SPEC, M, seed=8)
    tw, ti = random_routing(EP_SPEC, M, seed=9)
    ti[:4] = remote[:3].to(torch.int32)  # tokens 0-3 routed only to other ranks
    out = kernel(x, tw, ti, kernel.prepare_weights(w), out=poison(torch.empty_like(x)))
    assert torch.equal(out[:4], torch.zeros_like(out[:4]))
    assert rel_err(out, ops.moe_tokens(EP_SPEC, x, tw, ti, w, torch.float64)) <= ACCURACY


def test_expert_map_with_a_duplicate_local_id_is_rejected():
    expert_map = random_expert_map(EP_SPEC, seed=10)
    holders = torch.nonzero(expert_map >= 0).flatten()
    expert_map[holders[3]] = expert_map[holders[1]]
    with pytest.raises(ValueError, match=r"^weights.expert_map maps global experts \[.*\] to the same "
                                         r"local id"):
        check_expert_map(expert_map, EP_SPEC)
    kernel = ReferenceMoEKernel(EP_SPEC, Target("cpu", Caps()))
    with pytest.raises(ValueError, match=r"expert_map"):
        kernel.prepare_weights(attrs.evolve(random_weights(EP_SPEC, seed=11), expert_map=expert_map))


@pytest.mark.parametrize("value", [-2, EP_SPEC.local_experts, 1 << 30])
def test_expert_map_values_outside_the_local_range_are_rejected(value):
    expert_map = random_expert_map(EP_SPEC, seed=12)
    expert_map[0] = value
    with pytest.raises(ValueError, match=r"^weights.expert_map holds values in"):
        check_expert_map(expert_map, EP_SPEC)
