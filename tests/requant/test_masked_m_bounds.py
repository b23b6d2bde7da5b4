"""masked_m outside [0, max_m] with check=False: the Triton kernels clamp it, as the reference does,
so no row outside an expert's max_m rows is read or written. The tensors are views into larger
poisoned buffers, so a write past the first or last expert lands in a guard and shows; a count
that moved rows into the next expert shows against the reference. Triton's interpreter on CPU."""

from __future__ import annotations

import hal.backends.requant as requant
import pytest
import torch
from hal.backends.reference import backend as reference
from hal.backends.reference.ops import requant_fp8
from hal.backends.requant.geometry import RequantGeometry

from hal.backend import Target
from hal.caps import Caps
from hal.spec import MoESpec
from hal.synth import random_masked_inputs, random_weights
from hal.testing import assert_masked_rows, is_poison

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("interpreter")]

E, MAX_M, HIDDEN = 4, 5, 256
OUTPUT_SCALE = 9.0 / 448
BAD_COUNTS = {
    "negative_and_over": [-3, 9, 2, 7],
    "int32_extremes": [-(2**31), 0, 2**31 - 1, 5],
}


def guarded(inner: torch.Tensor) -> tuple:
    """(big, view): `inner`'s values in big[1:-1] of a tensor one expert larger on each side."""
    big = torch.empty((inner.shape[0] + 2, *inner.shape[1:]), dtype=inner.dtype)
    big.view(torch.uint8).random_(generator=torch.Generator().manual_seed(0))
    big[1:-1] = inner
    return big, big[1:-1]


def poisoned_guarded(shape, dtype, poisoned):
    big = poisoned(torch.empty((shape[0] + 2, *shape[1:])), dtype)
    return big, big[1:-1]


def clamped(counts) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int64).clamp(0, MAX_M).to(torch.int32)


@pytest.mark.parametrize("counts", list(BAD_COUNTS.values()), ids=list(BAD_COUNTS))
@pytest.mark.parametrize("launch", [("tuned", None), (RequantGeometry(1, 2, 1), None), ("legacy", None)],
                         ids=["tuned", "tuned-second-phase", "legacy"])
def test_requant_clamps_masked_m(counts, launch, poisoned):
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    live = clamped(counts)
    x, scale, _ = random_masked_inputs(E, HIDDEN, MAX_M, live.tolist(), seed=3, scale_layout="row")
    _, x = guarded(x)
    _, scale = guarded(scale)
    masked_m = torch.tensor(counts, dtype=torch.int32)
    out_big, out = poisoned_guarded(x.shape, torch.float8_e4m3fn, poisoned)
    s_out = torch.tensor([OUTPUT_SCALE])
    geometry, expected_rows = launch
    fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, out, expected_rows, geometry=geometry,
                                check=False)
    ref = requant_fp8(x, scale, masked_m, s_out, poisoned(x, torch.float8_e4m3fn))
    assert_masked_rows(out, ref, live)
    assert bool(is_poison(out_big[0]).all()) and bool(is_poison(out_big[-1]).all()), \
        "a row outside the experts' max_m rows was written"


def test_check_true_names_masked_m(poisoned):
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    x, scale, _ = random_masked_inputs(E, HIDDEN, MAX_M, [1, 1, 1, 1], seed=4)
    for counts in BAD_COUNTS.values():
        with pytest.raises(ValueError, match=r"^masked_m holds values in"):
            fp8_per_token_to_per_tensor(x, scale, torch.tensor(counts, dtype=torch.int32),
                                        torch.tensor([OUTPUT_SCALE]))


def test_w4afp8_masked_moe_clamps_masked_m():
    spec = MoESpec(num_experts=E, top_k=2, hidden_size=HIDDEN, intermediate_size=128,
                   weight_format="w4afp8", layout="masked")
    cpu = Target("cpu", Caps())
    weights = random_weights(spec, seed=1)
    mine = requant.backend.build(spec, cpu)
    ref = reference.build(spec, cpu)
    counts = BAD_COUNTS["negative_and_over"]
    live = clamped(counts)
    x, scale, _ = random_masked_inputs(E, HIDDEN, MAX_M, live.tolist(), seed=5, scale_layout="row")
    _, x = guarded(x)
    _, scale = guarded(scale)
    masked_m = torch.tensor(counts, dtype=torch.int32)
    out_big = torch.full((E + 2, MAX_M, HIDDEN), float("nan"), dtype=torch.bfloat16)
    out = out_big[1:-1]
    mine(x, scale, masked_m, mine.prepare_weights(weights), expected_rows=2, out=out, check=False)
    want = ref(x, scale, live, ref.prepare_weights(weights))
    for e, m in enumerate(live.tolist()):
        assert torch.equal(out[e, :m], want[e, :m])
        assert bool(out[e, m:].isnan().all()), "a row beyond the clamped masked_m was written"
    assert bool(out_big[0].isnan().all()) and bool(out_big[-1].isnan().all())
