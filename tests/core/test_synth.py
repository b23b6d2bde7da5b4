"""hal.synth: the inputs every kernel test and benchmark draws; their shape is part of what the
tests claim to cover."""

import pytest
import torch

import hal
from hal.synth import random_expert_map, random_masked_inputs, random_routing, random_tokens, random_weights

pytestmark = pytest.mark.cpu

SPEC = hal.MoESpec(num_experts=20, top_k=4, hidden_size=256, intermediate_size=128)


@pytest.mark.parametrize("mode", ["uniform", "concentrated", "one_expert"])
def test_routing_ids_are_distinct_per_token_and_weights_normalized(mode):
    tw, ti = random_routing(SPEC, 97, mode, seed=3)
    assert ti.dtype == torch.int32 and tw.dtype == torch.float32 and ti.shape == (97, 4)
    assert all(len(set(row)) == 4 for row in ti.tolist())
    assert int(ti.min()) >= 0 and int(ti.max()) < 20
    assert torch.allclose(tw.sum(1), torch.ones(97))


def test_one_expert_puts_every_token_on_it():
    _, ti = random_routing(SPEC, 50, "one_expert", hot_expert=7)
    assert bool((ti == 7).any(1).all())


def test_concentrated_routing_is_concentrated():
    _, ti = random_routing(SPEC, 2000, "concentrated", seed=1)
    counts = torch.bincount(ti.flatten().long(), minlength=20).sort(descending=True).values
    assert counts[:2].sum() / counts.sum() > 0.15  # 2 hot experts of 20 take far more than 10%


def test_counts_mode_is_exact():
    counts = [0] * 20
    counts[0], counts[3], counts[19] = 10, 5, 1
    spec = hal.MoESpec(num_experts=20, top_k=1, hidden_size=256, intermediate_size=128)
    _, ti = random_routing(spec, 16, "counts", counts=counts)
    assert torch.bincount(ti.flatten().long(), minlength=20).tolist() == counts
    with pytest.raises(ValueError, match="counts must have 20 entries"):
        random_routing(spec, 16, "counts", counts=[16])


def test_inputs_are_never_zero_and_ep_map_is_a_partial_permutation():
    spec = hal.MoESpec(num_experts=20, top_k=4, hidden_size=256, intermediate_size=128,
                       weight_format="fp8_block128", num_local_experts=6)
    w = random_weights(spec)
    assert float(w.w13.float().abs().sum()) > 0 and float(random_tokens(spec, 3).abs().sum()) > 0
    m = random_expert_map(spec, seed=2)
    local = sorted(v for v in m.tolist() if v >= 0)
    assert local == list(range(6)) and m.tolist().count(-1) == 14


@pytest.mark.parametrize("layout", ["column", "row"])
def test_masked_inputs_poison_scales_beyond_masked_m(layout):
    x, scale, masked_m = random_masked_inputs(3, 256, 4, [0, 4, 2], scale_layout=layout)
    assert x.shape == (3, 4, 256) and scale.shape == (3, 4, 2) and masked_m.tolist() == [0, 4, 2]
    assert torch.isnan(scale[0]).all() and torch.isnan(scale[2, 2:]).all()
    assert not torch.isnan(scale[1]).any()
    if layout == "column":
        assert scale.stride() == (8, 1, 4)
