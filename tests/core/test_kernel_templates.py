"""The kernel templates of hal.kernel, one per op: validate, allocate, skip empty, then the hook;
and every plan has describe(). Minimal backends here record what reaches their hooks."""

import pytest
import torch

import hal
from hal import ops, synth
from hal.backend import Target
from hal.caps import Caps
from hal.kernel import MaskedMoEKernel, MoEKernel, Plan, RequantKernel

pytestmark = pytest.mark.cpu

CPU = Target("cpu", Caps())
MOE = hal.MoESpec(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64)
MASKED = hal.MoESpec(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128,
                     weight_format="w4afp8", layout="masked")
REQUANT = hal.RequantSpec(num_experts=3, hidden_size=256)


class Recording:
    """Hooks that record their calls and fill the output, so skipped calls show."""

    backend = "recording"

    def _prepare(self, weights):
        return "data"

    def _run(self, *args):
        self.runs = getattr(self, "runs", 0) + 1


class RecMoE(Recording, MoEKernel):
    pass


class RecMasked(Recording, MaskedMoEKernel):
    pass


class RecRequant(Recording, RequantKernel):
    pass


def test_the_op_table_names_each_template():
    assert [op.name for op in ops.OPS] == ["moe", "moe_masked", "requant"]
    for op, template in zip(ops.OPS, (MoEKernel, MaskedMoEKernel, RequantKernel), strict=True):
        assert op.template_class() is template and template.op == op.name
    assert {op.override_variable for op in ops.OPS} == {"HAL_MOE_BACKEND", "HAL_MOE_MASKED_BACKEND",
                                                        "HAL_REQUANT_BACKEND"}
    with pytest.raises(ValueError, match="spec must be"):
        ops.op_of(object())


def test_moe_template_skips_empty_batches_and_allocates():
    kernel = RecMoE(MOE, CPU)
    prepared = kernel.prepare_weights(synth.random_weights(MOE))
    tw, ti = synth.random_routing(MOE, 0)
    out = kernel(synth.random_tokens(MOE, 0), tw, ti, prepared)
    assert out.shape == (0, 128) and not hasattr(kernel, "runs")
    tw, ti = synth.random_routing(MOE, 3)
    out = kernel(synth.random_tokens(MOE, 3), tw, ti, prepared)
    assert out.shape == (3, 128) and out.dtype == torch.bfloat16 and kernel.runs == 1


def test_masked_template_validates_then_skips_empty():
    kernel = RecMasked(MASKED, CPU)
    prepared = kernel.prepare_weights(synth.random_weights(MASKED))
    x, scale, masked_m = synth.random_masked_inputs(4, 128, 0, [0] * 4)
    out = kernel(x, scale, masked_m, prepared)
    assert out.shape == (4, 0, 128) and out.dtype == torch.bfloat16 and not hasattr(kernel, "runs")
    x, scale, masked_m = synth.random_masked_inputs(4, 128, 2, [2, 0, 1, 0])
    with pytest.raises(ValueError, match="^x has dtype torch.float8_e4m3fnuz"):
        kernel(x.to(torch.float8_e4m3fnuz), scale, masked_m, prepared)
    with pytest.raises(ValueError, match="^out must be"):
        kernel(x, scale, masked_m, prepared, out=torch.empty(x.shape, dtype=torch.float32))
    kernel(x, scale, masked_m, prepared)
    assert kernel.runs == 1


def test_requant_template_validates_allocates_and_skips_empty():
    kernel = RecRequant(REQUANT, CPU)
    s_out = torch.tensor([0.5])
    x, scale, masked_m = synth.random_masked_inputs(3, 256, 0, [0] * 3)
    assert kernel(x, scale, masked_m, s_out).dtype == torch.float8_e4m3fn
    assert not hasattr(kernel, "runs")
    x, scale, masked_m = synth.random_masked_inputs(3, 256, 2, [1, 2, 0])
    with pytest.raises(ValueError, match="^output_scale"):
        kernel(x, scale, masked_m, torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="^x has shape"):
        kernel(x[:2], scale[:2], masked_m[:2], s_out)
    kernel(x, scale, masked_m, s_out)
    assert kernel.runs == 1


@pytest.mark.parametrize("spec", [MOE, MASKED, REQUANT], ids=["moe", "moe_masked", "requant"])
def test_every_reference_plan_describes_itself_from_the_templates_plan_inputs(spec):
    kernel = hal.select_kernel(spec, "cpu", caps=Caps(), prefer="reference")
    plan = kernel.plan(**kernel.plan_inputs(5, "concentrated"))
    assert isinstance(plan, Plan) and plan.describe()
