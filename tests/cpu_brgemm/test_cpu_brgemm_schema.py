"""The cpu_brgemm custom ops as torch sees them: full schemas whose declared mutations are exactly
what the ops write (torch.library.opcheck runs each op and compares)."""

from __future__ import annotations

import attrs
import pytest
from cpu_brgemm_helpers import machine_target, make_kernel, runnable_isas
from hal.backends.cpu_brgemm import extension

from hal import synth
from hal.spec import MoESpec
from hal.testing.opcheck import Recorder, opcheck_recorded

pytestmark = pytest.mark.cpu

@pytest.fixture
def recorded_ops(monkeypatch):
    from hal.backends.cpu_brgemm.kernel import CpuBrgemmKernel

    isa = runnable_isas()[0] if runnable_isas() else pytest.skip("this CPU runs no cpu_brgemm build")
    recorder = Recorder(extension.ops(isa))
    monkeypatch.setattr(CpuBrgemmKernel, "ops", property(lambda self: recorder))
    return isa, recorder


def test_fused_moe_and_route_plan_declare_what_they_write(recorded_ops):
    isa, recorder = recorded_ops
    spec = MoESpec(num_experts=8, top_k=2, hidden_size=64, intermediate_size=96, weight_format="bf16",
                   num_local_experts=6)
    kernel = make_kernel(spec, machine_target(), isa)
    weights = attrs.evolve(synth.random_weights(spec, seed=3),
                           expert_map=synth.random_expert_map(spec, seed=4))
    prepared = kernel.prepare_weights(weights)
    x = synth.random_tokens(spec, 5, seed=5)
    topk_weights, topk_ids = synth.random_routing(spec, 5, seed=6)
    kernel(x, topk_weights, topk_ids, prepared)
    kernel.plan(topk_ids, expert_map=weights.expert_map)
    assert set(recorder.calls) >= {"fused_moe", "route_plan"}
    opcheck_recorded(recorder, ("fused_moe", "route_plan"))
    assert "Tensor(a!) out" in str(recorder.calls["fused_moe"][0].default._schema)

