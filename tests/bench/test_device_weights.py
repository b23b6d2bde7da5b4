"""The GPU benchmarks' weights (benchmarks/device_weights.py), made here on the CPU: the contract's
shapes and dtypes for every format, with bias and under an expert map, and a layer whose outputs
are O(1), so a benchmark times the kernels on the values they meet in a model."""

import importlib.util
from pathlib import Path

import pytest
import torch

import hal
from hal.synth import random_routing, random_tokens
from hal.weights_check import check_weights

pytestmark = pytest.mark.cpu

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "device_weights.py"
_SPEC = importlib.util.spec_from_file_location("device_weights", _PATH)
device_weights = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(device_weights)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block128", "mxfp4", "int4_g128"])
@pytest.mark.parametrize("extra", [{}, {"has_bias": True}, {"num_local_experts": 5}],
                         ids=["plain", "bias", "ep"])
def test_weights_meet_the_contract_and_give_outputs_of_order_one(fmt, extra):
    activation = "swiglu_oai" if fmt == "mxfp4" else "silu"
    spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=384, weight_format=fmt,
                       activation=activation, **extra)
    weights = device_weights.device_weights(spec, 7, "cpu")
    check_weights(weights, spec)
    kernel = hal.select_moe_kernel(spec, "cpu", prefer="reference")
    x = random_tokens(spec, 16, seed=1, device="cpu")
    tw, ti = random_routing(spec, 16, "uniform", seed=2, device="cpu")
    out = kernel(x, tw, ti, kernel.prepare_weights(weights)).float()
    assert torch.isfinite(out).all()
    rms = out.pow(2).mean().sqrt().item()
    assert 0.05 < rms < 20, rms


def test_int4_per_channel_has_one_scale_group_over_k():
    spec = hal.MoESpec(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128,
                       weight_format="int4_g128", group_size=-1)
    weights = device_weights.device_weights(spec, 7, "cpu")
    check_weights(weights, spec)
    assert weights.w13_scale.shape[1] == 1 and weights.w2_scale.shape[1] == 1


def test_a_format_it_does_not_make_is_named():
    spec = hal.MoESpec(num_experts=4, top_k=2, hidden_size=256, intermediate_size=128, weight_format="w4afp8",
                       layout="masked")
    with pytest.raises(ValueError, match="w4afp8"):
        device_weights.device_weights(spec, 7, "cpu")
