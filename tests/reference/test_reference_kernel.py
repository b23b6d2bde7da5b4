"""The reference backend through the kernel API: its exact messages and masked rows. The contract
every backend's kernel shares (poisoned out=, float64 accuracy, EP) is hal.testing.conformance."""

import attrs
import pytest
import torch
from hal.backends.reference import ops

import hal
from hal.caps import Caps
from hal.synth import random_expert_map, random_masked_inputs, random_routing, random_tokens, random_weights
from hal.testing import poison

pytestmark = pytest.mark.cpu


def build(spec):
    return hal.select_moe_kernel(spec, "cpu", caps=Caps(), prefer="reference")


def test_empty_batch_and_bad_inputs_name_the_argument():
    spec = hal.MoESpec(num_experts=4, top_k=2, hidden_size=128, intermediate_size=64)
    kernel = build(spec)
    prepared = kernel.prepare_weights(random_weights(spec))
    x = random_tokens(spec, 0)
    tw, ti = random_routing(spec, 0)
    assert kernel(x, tw, ti, prepared).shape == (0, 128)
    x = random_tokens(spec, 3)
    tw, ti = random_routing(spec, 3)
    with pytest.raises(ValueError, match=r"^x has dtype torch.float32"):
        kernel(x.float(), tw, ti, prepared)
    with pytest.raises(ValueError, match=r"^topk_ids holds values in \[4, 4\]: expected \[-1, 4\)"):
        kernel(x, tw, torch.full_like(ti, 4), prepared)
    with pytest.raises(ValueError, match=r"^topk_weights has shape"):
        kernel(x, tw[:, :1], ti, prepared)
    with pytest.raises(ValueError, match=r"^out must be"):
        kernel(x, tw, ti, prepared, out=torch.empty(2, 128, dtype=torch.bfloat16))
    other = hal.MoESpec(num_experts=4, top_k=1, hidden_size=128, intermediate_size=64)
    with pytest.raises(ValueError, match="prepared was made"):
        build(other)(x, tw[:, :1], ti[:, :1], prepared)


def test_masked_w4afp8_rows_beyond_masked_m_untouched():
    spec = hal.MoESpec(num_experts=16, top_k=8, hidden_size=256, intermediate_size=128,
                       weight_format="w4afp8", layout="masked", num_local_experts=4)
    kernel = build(spec)
    w = random_weights(spec, seed=5)
    w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=6))
    prepared = kernel.prepare_weights(w)
    masked = [0, 6, 1, 0]
    x, scale, masked_m = random_masked_inputs(4, 256, 6, masked, seed=7)
    out = poison(torch.empty(x.shape, dtype=torch.bfloat16))
    kernel(x, scale, masked_m, prepared, expected_rows=2, out=out)
    for e, m in enumerate(masked):
        assert not torch.isnan(out[e, :m]).any()
        assert torch.isnan(out[e, m:]).all()
    want = ops.moe_masked(spec, x, scale, masked_m, w, torch.zeros_like(out), torch.float64)
    assert (out[1].double() - want[1].double()).norm() <= 2e-2 * want[1].double().norm()


def test_requant_kernel_rejects_bad_arguments_by_name():
    kernel = hal.select_requant_kernel(hal.RequantSpec(num_experts=2, hidden_size=256), "cpu",
                                       caps=Caps(), prefer="reference")
    x, scale, masked_m = random_masked_inputs(2, 256, 3, [3, 1], seed=4)
    s_out = torch.tensor([0.05])
    cases = [
        (dict(out=torch.empty(x.shape, dtype=torch.bfloat16)), r"^out must be a torch.float8_e4m3fn"),
        (dict(output_scale=torch.tensor([0.0])), r"^output_scale=0.0: expected a finite normal value"),
        (dict(output_scale=torch.tensor([1, 2.0])), r"^output_scale must be a one-element"),
        (dict(x=x.view(torch.uint8)), r"^x has dtype torch.uint8"),
    ]
    for change, message in cases:
        args = dict(x=x, x_scale=scale, masked_m=masked_m, output_scale=s_out, out=None) | change
        with pytest.raises(ValueError, match=message):
            kernel(args["x"], args["x_scale"], args["masked_m"], args["output_scale"], out=args["out"])
    assert kernel(x, scale, masked_m, s_out).dtype == torch.float8_e4m3fn
