"""The Marlin tile layout on CPU: a round trip through a pure-torch unpack, and the claim the kernel
rests on, that (word >> 4i) & 0x000f000f of each lane is register i of the mma.sync A fragment."""

from __future__ import annotations

import pytest
import torch
from hal.backends.marlin import repack

pytestmark = pytest.mark.cpu


def random_qweight(E, K, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (E, K // 8, N), generator=g, dtype=torch.int64).to(torch.int32)


@pytest.mark.parametrize("E,K,N", [(1, 16, 64), (3, 128, 192), (2, 384, 256)])
def test_round_trip(E, K, N):
    q = random_qweight(E, K, N, seed=K + N)
    packed = repack.repack(q)
    assert packed.shape == (E, N // 64, K // 16, 32, 4) and packed.dtype == torch.int32
    assert torch.equal(repack.unpack(packed), repack.gptq_nibbles(q))


def test_nibbles_match_the_reference_dequant():
    from hal.backends.reference import dequant

    q = random_qweight(2, 256, 128, seed=3)
    scales = torch.ones(2, 2, 128)
    w = dequant.uint4b8(q, scales, torch.float32)  # [E, N, K]
    assert torch.equal(repack.gptq_nibbles(q).float() - 8, w.transpose(-1, -2))


def test_every_lane_holds_its_mma_fragment():
    q = random_qweight(1, 32, 128, seed=5)
    packed = repack.repack(q)[0]  # [nc, kb, 32, 4]
    nib = repack.gptq_nibbles(q)[0]  # [K, N]
    for nc in range(packed.shape[0]):
        for kb in range(packed.shape[1]):
            for lane in range(32):
                for j in range(4):
                    word = int(packed[nc, kb, lane, j]) & 0xFFFFFFFF
                    for reg in range(4):
                        for half in range(2):
                            value = (word >> (4 * reg + 16 * half)) & 0xF
                            n, k = repack.fragment_element(lane, reg, half)
                            assert value == int(nib[kb * 16 + k, nc * 64 + j * 16 + n])


def test_fragment_element_covers_the_tile_once():
    seen = {repack.fragment_element(lane, reg, half)
            for lane in range(32) for reg in range(4) for half in range(2)}
    assert seen == {(n, k) for n in range(16) for k in range(16)}


@pytest.mark.parametrize("shape,dtype,match", [
    ((1, 2, 64), torch.int64, "int32"),
    ((1, 1, 64), torch.int32, "multiple of 16"),
    ((1, 2, 96), torch.int32, "multiple of 64"),
])
def test_bad_input_names_the_argument(shape, dtype, match):
    with pytest.raises(ValueError, match=match):
        repack.repack(torch.zeros(shape, dtype=dtype), "weights.w13")


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai", "relu2"])
def test_gate_up_columns_pair_what_the_epilogue_pairs(activation):
    """GEMM 1's epilogue activates physical columns 32q + r (gate) and 32q + 16 + r (up) into
    intermediate column 16q + r (relu2: each column on its own); with the columns in
    gate_up_columns order that must be the reference activation of the spec's columns."""
    from hal.backends.reference import activation as reference

    import hal

    inter = 384
    spec = hal.MoESpec(8, 2, 256, inter, "int4_g128", activation)
    cols = repack.gate_up_columns(activation, inter)
    assert sorted(cols.tolist()) == list(range(spec.w13_rows))  # a permutation
    h = torch.randn(5, spec.w13_rows, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    physical = h[:, cols]
    if activation == "relu2":
        got = torch.relu(physical).square()
    else:
        runs = physical.view(5, inter // 16, 2, 16)
        gate, up = runs[:, :, 0].reshape(5, inter), runs[:, :, 1].reshape(5, inter)
        if activation == "silu":
            got = torch.nn.functional.silu(gate) * up
        else:
            gate, up = gate.clamp(max=spec.swiglu_limit), up.clamp(-spec.swiglu_limit, spec.swiglu_limit)
            got = gate * torch.sigmoid(spec.swiglu_alpha * gate) * (up + 1)
    torch.testing.assert_close(got, reference.apply(spec, h), rtol=0, atol=0)


def test_gate_up_columns_rejects_what_it_cannot_pair():
    with pytest.raises(ValueError, match="intermediate_size"):
        repack.gate_up_columns("silu", 72)
    with pytest.raises(ValueError, match="activation"):
        repack.gate_up_columns("gelu", 64)
