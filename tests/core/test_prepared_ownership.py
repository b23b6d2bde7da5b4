"""Prepared weights own their memory: hal.owned copies what a backend's prepare left shared with the
caller's tensors and keeps the rest, and prepare_weights validates the expert_map it keeps."""

from collections import namedtuple

import attrs
import pytest
import torch

import hal
from hal import synth
from hal.owned import owned
from hal.testing import harness

pytestmark = pytest.mark.cpu

Pair = namedtuple("Pair", "first second")


@attrs.frozen
class Packed:
    repacked: torch.Tensor
    kept: torch.Tensor
    nested: dict
    count: int


def test_owned_copies_only_what_overlaps_the_sources():
    source = torch.arange(16.0)
    other = torch.arange(4.0)
    repacked = source.flip(0)  # a new tensor
    data = Packed(repacked, source.view(4, 4), {"bias": source[3:7], "pair": Pair(other, source)}, 3)
    result = owned(data, [source, None])
    assert result.repacked is repacked
    assert result.nested["pair"].first is other
    for copy, view in ((result.kept, data.kept), (result.nested["bias"], data.nested["bias"]),
                       (result.nested["pair"].second, source)):
        assert torch.equal(copy, view)
        assert copy.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()
    assert isinstance(result.nested["pair"], Pair) and result.count == 3
    source.fill_(-1)
    assert torch.equal(result.kept.flatten(), torch.arange(16.0))


def test_owned_returns_data_untouched_when_nothing_is_shared():
    data = {"w": torch.ones(3), "items": (torch.zeros(2), 1)}
    assert owned(data, [torch.ones(3)]) is data


def test_owned_sees_overlap_between_distinct_storages_of_one_buffer():
    """Two tensors made over the same memory (torch.frombuffer, DLPack) have distinct storages."""
    buffer = bytearray(64)
    source = torch.frombuffer(buffer, dtype=torch.uint8)
    alias = torch.frombuffer(buffer, dtype=torch.uint8, count=16, offset=8)
    assert owned(alias, [source]) is not alias


@pytest.mark.parametrize("backend", ["reference", "cpu_brgemm"])
def test_an_expert_map_edited_after_prepare_changes_nothing(backend):
    """The caller maps two global experts onto one local id after prepare_weights validated its
    map: the kernel keeps the map it validated."""
    spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=64, intermediate_size=96, num_local_experts=4)
    try:
        kernel = hal.select_moe_kernel(spec, "cpu", prefer=backend)
    except hal.NoKernelError as exc:
        pytest.skip(str(exc))
    weights = harness.weights_for(spec, "cpu", seed=3)
    prepared = kernel.prepare_weights(weights)
    x = synth.random_tokens(spec, 6, seed=4)
    tw, ti = synth.random_routing(spec, 6, seed=5)
    before = kernel(x, tw, ti, prepared)
    local = torch.nonzero(weights.expert_map >= 0).flatten()
    weights.expert_map[local[1]] = weights.expert_map[local[0]]
    with pytest.raises(ValueError, match="same local id"):
        weights.validate(spec)
    assert torch.equal(before, kernel(x, tw, ti, prepared))
