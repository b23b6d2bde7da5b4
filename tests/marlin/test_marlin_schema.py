"""The Marlin custom ops as torch sees them: full schemas whose declared mutations are exactly what
the ops write (torch.library.opcheck runs each op and compares)."""

from __future__ import annotations

import pytest
import torch
from hal.backends.marlin.kernel import MarlinMoEKernel

import hal
from hal.backend import Target
from hal.synth import random_routing, random_tokens, random_weights
from hal.testing.opcheck import EAGER_CHECKS as CHECKS
from hal.testing.opcheck import Recorder, opcheck_recorded

pytestmark = pytest.mark.cuda

DEVICE = "cuda:0"
SPEC = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                   weight_format="int4_g128")


def test_every_marlin_op_declares_what_it_writes():
    kernel = MarlinMoEKernel(SPEC, Target(DEVICE, hal.probe(deep=True)))
    ops = kernel.loaded_ops()
    recorder = Recorder(ops)
    kernel._ops = recorder
    prepared = kernel.prepare_weights(random_weights(SPEC, device=DEVICE, seed=1))
    x = random_tokens(SPEC, 7, seed=2, device=DEVICE)
    topk_weights, topk_ids = random_routing(SPEC, 7, seed=3, device=DEVICE)
    kernel(x, topk_weights, topk_ids, prepared)
    opcheck_recorded(recorder, ("moe",))
    assert "Tensor(a!) out" in str(recorder.calls["moe"][0].default._schema)

    torch.library.opcheck(ops.kernel_attributes.default, (), test_utils=CHECKS)
    block_m = kernel.plan(topk_ids).block_m
    route_args = (topk_ids, None, SPEC.num_experts, block_m)
    torch.library.opcheck(ops.route.default, route_args, test_utils=CHECKS)

    sorted_routes, block_expert, num_blocks, _ = ops.route(*route_args)
    choice = kernel.plan(topk_ids).gemm13
    routes = topk_ids.numel()
    c = torch.zeros(choice.splits, routes, SPEC.w13_rows, device=DEVICE)
    data = prepared.data
    gemm_args = (x, SPEC.top_k, data.w13, data.s13, data.group13, None, None, sorted_routes,
                 block_expert, num_blocks, c, 1, False, routes, 1, choice.config.index, choice.splits)
    torch.library.opcheck(ops.gemm.default, gemm_args, test_utils=CHECKS)
    assert "Tensor(a!) c" in str(ops.gemm.default._schema)
