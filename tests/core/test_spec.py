import pytest
import torch

import hal
from hal.synth import random_weights

pytestmark = pytest.mark.cpu

GOOD = dict(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128)


@pytest.mark.parametrize("change, field", [
    (dict(top_k=9), "top_k"),
    (dict(num_experts=0), "num_experts"),
    (dict(hidden_size=-128), "hidden_size"),
    (dict(activation="gelu"), "activation"),
    (dict(weight_format="int3"), "weight_format"),
    (dict(weight_format="mxfp4", hidden_size=272), "hidden_size"),
    (dict(weight_format="int4_g128", intermediate_size=200), "intermediate_size"),
    (dict(num_local_experts=9), "num_local_experts"),
    (dict(group_size=64), "group_size"),
    (dict(weight_format="w4afp8"), "layout"),
    (dict(layout="masked"), "layout"),
    (dict(act_dtype="float32"), "act_dtype"),
    (dict(act_quant="int8"), "act_quant"),
    (dict(act_quant="fp8_g128", weight_format="w4afp8", layout="masked"), "act_quant"),
])
def test_bad_spec_names_the_field(change, field):
    with pytest.raises(ValueError) as err:
        hal.MoESpec(**{**GOOD, **change})
    message = str(err.value)
    assert message.startswith(f"{field}="), message
    assert "expected" in message


def test_ep_properties():
    spec = hal.MoESpec(**GOOD, num_local_experts=3)
    assert spec.is_ep and spec.local_experts == 3
    assert not hal.MoESpec(**GOOD, num_local_experts=8).is_ep


@pytest.mark.parametrize("fmt", ["bf16", "fp8_block128", "mxfp4", "int4_g128"])
def test_random_weights_match_the_contract(fmt):
    spec = hal.MoESpec(**GOOD, weight_format=fmt, has_bias=True)
    random_weights(spec).validate(spec)


@pytest.mark.parametrize("name, mutate, needle", [
    ("w13", lambda w: w.w13[:, :-1], "weights.w13 has shape"),
    ("w2", lambda w: w.w2.float(), "weights.w2 has dtype"),
    ("w13_scale", lambda w: None, "weights.w13_scale is missing"),
])
def test_bad_weights_name_the_tensor(name, mutate, needle):
    import attrs

    spec = hal.MoESpec(**GOOD, weight_format="fp8_block128")
    w = random_weights(spec)
    bad = attrs.evolve(w, **{name: mutate(w)})
    with pytest.raises(ValueError, match=needle):
        bad.validate(spec)


def test_expert_map_checked():
    import attrs

    spec = hal.MoESpec(**GOOD, num_local_experts=4)
    w = random_weights(spec)
    with pytest.raises(ValueError, match="expert_map is missing"):
        w.validate(spec)
    bad = torch.full((8,), 5, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"expert_map holds values in \[5, 5\]"):
        attrs.evolve(w, expert_map=bad).validate(spec)


def test_requant_spec_checks_hidden():
    with pytest.raises(ValueError, match="hidden_size=100"):
        hal.RequantSpec(num_experts=4, hidden_size=100)
