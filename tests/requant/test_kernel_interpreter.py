"""The Triton requant against hal.backends.reference, bit for bit, in Triton's interpreter on CPU.
Small payloads: the interpreter runs every program in numpy."""

from __future__ import annotations

import itertools

import pytest
import torch
from hal.backends.reference.ops import requant_fp8

from hal.caps import GpuCaps, GpuFeatures
from hal.synth import random_masked_inputs
from hal.testing import assert_masked_rows

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("interpreter")]

OUTPUT_SCALE = 9.0 / 448  # synth's activations reach |x * s| ~ 9, so some values saturate
MASKS = {
    "random": [3, 0, 7, 1, 5],
    "all_empty": [0, 0, 0, 0, 0],
    "leading_and_trailing_empty": [0, 0, 4, 7, 0],
    "full": [7, 7, 7, 7, 7],
    "one_expert_takes_all": [0, 7, 0, 0, 0],
}


def run(x, scale, masked_m, poisoned, dtype=torch.float8_e4m3fn, output_scale=OUTPUT_SCALE, **kw):
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    s_out = torch.tensor([output_scale])
    out = fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, poisoned(x, dtype), **kw)
    ref = requant_fp8(x, scale, masked_m, s_out, poisoned(x, dtype))
    return out, ref


@pytest.mark.parametrize("layout", ["row", "column"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("hidden", [128, 384, 1152])
def test_tuned_and_legacy_match_the_reference(layout, mask, hidden, poisoned):
    x, scale, masked_m = random_masked_inputs(5, hidden, 7, MASKS[mask], seed=hidden,
                                              scale_layout=layout)
    for geometry, expected_rows in (("tuned", None), ("tuned", 2), ("tuned", 0), ("legacy", None)):
        out, ref = run(x, scale, masked_m, poisoned, geometry=geometry, expected_rows=expected_rows)
        assert_masked_rows(out, ref, masked_m)


def test_every_launch_geometry_writes_the_same_bytes(poisoned):
    from hal.backends.requant.geometry import RequantGeometry

    x, scale, masked_m = random_masked_inputs(4, 1152, 9, [9, 0, 2, 5], seed=7)
    for g_block, m_grid, row_cap in itertools.product((1, 2, 8, 16), (1, 3, 4), (0, 1, 3, 9)):
        out, ref = run(x, scale, masked_m, poisoned,
                       geometry=RequantGeometry(g_block, m_grid, row_cap))
        assert_masked_rows(out, ref, masked_m)


def test_cache_hints_and_row_pairs_write_the_same_bytes(poisoned):
    from hal.backends.requant.geometry import RequantGeometry

    x, scale, masked_m = random_masked_inputs(4, 1152, 9, [9, 0, 2, 5], seed=8)
    for streaming, paired in itertools.product((False, True), (False, True)):
        for g_block, m_grid, row_cap in ((8, 1, 9), (2, 3, 1), (16, 2, 0)):
            geometry = RequantGeometry(g_block, m_grid, row_cap, streaming=streaming, paired=paired)
            out, ref = run(x, scale, masked_m, poisoned, geometry=geometry)
            assert_masked_rows(out, ref, masked_m)


def test_hot_expert_rows_go_through_the_second_phase(poisoned):
    """Skew: one expert far above the cap, the others at or under it."""
    x, scale, masked_m = random_masked_inputs(6, 256, 24, [24, 1, 0, 2, 1, 3], seed=3)
    out, ref = run(x, scale, masked_m, poisoned, expected_rows=(31 + 6) // 6)
    assert_masked_rows(out, ref, masked_m)


def test_fnuz_devices_saturate_at_their_own_max(poisoned):
    """gfx942 (MI300X): e4m3fnuz, max 240, wave64, from the capabilities it is given."""
    mi300x = GpuCaps(vendor="amd", name="MI300X", arch="gfx942", warp_size=64,
                     features=GpuFeatures(fp8="fnuz", mfma=True))
    x, scale, masked_m = random_masked_inputs(3, 512, 5, [5, 2, 0], seed=5)
    fnuz_max = torch.finfo(torch.float8_e4m3fnuz).max
    x = x.float().clamp(-fnuz_max, fnuz_max).to(torch.float8_e4m3fnuz)  # torch's cast does not saturate
    out, ref = run(x, scale, masked_m, poisoned, dtype=torch.float8_e4m3fnuz, output_scale=4.0 / 448,
                   gpu=mi300x, expected_rows=3)
    assert_masked_rows(out, ref, masked_m)
    assert float(out[0, :5].float().abs().max()) == 240.0, "expected some values to saturate"


def test_ep_style_many_experts_few_rows(poisoned):
    x, scale, masked_m = random_masked_inputs(40, 256, 3, [i % 4 for i in range(40)], seed=11)
    out, ref = run(x, scale, masked_m, poisoned, expected_rows=(60 + 40) // 40)
    assert_masked_rows(out, ref, masked_m)
