"""The Triton requant on a real GPU, bit for bit against hal.backends.reference, on real shapes."""

from __future__ import annotations

import itertools

import pytest
import torch
from hal.backends.reference.ops import requant_fp8

from hal.synth import random_masked_inputs
from hal.testing import assert_masked_rows

pytestmark = pytest.mark.cuda

OUTPUT_SCALE = 9.0 / 448
NUM_EXPERTS = 8
MAX_M = 48
MASKS = {
    "random": [17, 0, 48, 3, 1, 29, 0, 8],
    "all_empty": [0] * 8,
    "leading_and_trailing_empty": [0, 0, 5, 48, 12, 1, 0, 0],
    "full": [48] * 8,
    "one_hot_expert": [0, 0, 0, 48, 0, 0, 0, 1],
}


@pytest.fixture(scope="module")
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"Triton cannot be imported: {exc}")
    import hal

    caps = hal.probe(deep=True)
    found = [g for g in caps.gpus if g.index == torch.cuda.current_device()]
    if not found:
        pytest.skip("hal.probe() lists no GPU for the current device")
    return found[0]


def poisoned(x, dtype):
    return torch.full(x.shape, float("nan"), device=x.device).to(dtype)


def inputs(hidden, mask, layout, seed):
    return random_masked_inputs(NUM_EXPERTS, hidden, MAX_M, MASKS[mask], seed=seed, device="cuda",
                                scale_layout=layout)


def check_against_reference(x, scale, masked_m, out, dtype):
    s_out = torch.tensor([OUTPUT_SCALE], device=x.device)
    assert_masked_rows(out, requant_fp8(x, scale, masked_m, s_out, poisoned(x, dtype)), masked_m)


@pytest.mark.parametrize("layout", ["row", "column"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("hidden", [7168, 3584, 1152])
def test_tuned_and_legacy_are_bit_exact(gpu, hidden, mask, layout):
    from hal.backends.requant.device import traits_from_gpu
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    dtype = traits_from_gpu(gpu, "test").fp8_dtype
    x, scale, masked_m = inputs(hidden, mask, layout, seed=hidden + len(mask))
    s_out = torch.tensor([OUTPUT_SCALE], device="cuda")
    total = int(masked_m.sum())
    for geometry, expected_rows in (("tuned", None), ("tuned", (total + NUM_EXPERTS) // NUM_EXPERTS),
                                    ("tuned", 0), ("legacy", None)):
        out = fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, poisoned(x, dtype),
                                          expected_rows=expected_rows, geometry=geometry)
        check_against_reference(x, scale, masked_m, out, dtype)


@pytest.mark.parametrize("layout", ["row", "column"])
def test_every_launch_geometry_writes_the_same_bytes(gpu, layout):
    from hal.backends.requant.device import traits_from_gpu
    from hal.backends.requant.geometry import RequantGeometry
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    dtype = traits_from_gpu(gpu, "test").fp8_dtype
    x, scale, masked_m = inputs(7168, "random", layout, seed=1)
    s_out = torch.tensor([OUTPUT_SCALE], device="cuda")
    for g_block, m_grid, row_cap in itertools.product((1, 2, 4, 8, 16, 32, 64), (1, 4, 7, 32),
                                                      (0, 1, 5, 34, MAX_M)):
        out = fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, poisoned(x, dtype),
                                          geometry=RequantGeometry(g_block, m_grid, row_cap))
        check_against_reference(x, scale, masked_m, out, dtype)


@pytest.mark.parametrize("streaming, paired", list(itertools.product((False, True), (False, True))))
@pytest.mark.parametrize("hidden", [7168, 4096])
def test_cache_hints_and_row_pairs_write_the_same_bytes(gpu, hidden, streaming, paired):
    """Both phases, a partial last tile (7168 at 16 groups) and none (4096), odd m-grids."""
    from hal.backends.requant.device import traits_from_gpu
    from hal.backends.requant.geometry import RequantGeometry
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    dtype = traits_from_gpu(gpu, "test").fp8_dtype
    x, scale, masked_m = inputs(hidden, "random", "column", seed=hidden + 2 * paired + streaming)
    s_out = torch.tensor([OUTPUT_SCALE], device="cuda")
    for g_block, m_grid, row_cap in ((8, 1, MAX_M), (16, 3, 5), (16, 7, 0), (32, 32, 34)):
        geometry = RequantGeometry(g_block, m_grid, row_cap, streaming=streaming, paired=paired)
        out = fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, poisoned(x, dtype),
                                          geometry=geometry)
        check_against_reference(x, scale, masked_m, out, dtype)


def test_many_experts_under_skew_through_the_backend(gpu):
    """256 local experts, one hot expert holding 16x the average: the second phase at scale."""
    import hal.backends.requant as requant

    import hal
    from hal.backend import Target

    spec = hal.RequantSpec(num_experts=256, hidden_size=7168)
    kernel = requant.backend.build(spec, Target(f"cuda:{gpu.index}", hal.probe(deep=True)))
    counts = [8] * 256
    counts[17] = 128
    counts[200:215] = [0] * 15  # the total stays 256 x 8
    x, scale, masked_m = random_masked_inputs(256, 7168, 128, counts, seed=2, device="cuda")
    s_out = torch.tensor([OUTPUT_SCALE], device="cuda")
    expected_rows = (sum(counts) + 256) // 256
    assert kernel.plan(max_m=128, expected_rows=expected_rows).second_phase
    for variant in (kernel, kernel.baselines()["legacy"]):
        out = poisoned(x, kernel.traits.fp8_dtype)
        variant(x, scale, masked_m, s_out, out=out, expected_rows=expected_rows)
        check_against_reference(x, scale, masked_m, out, kernel.traits.fp8_dtype)


def test_check_false_runs_under_cuda_graph_capture(gpu):
    from hal.backends.requant.op import fp8_per_token_to_per_tensor

    x, scale, masked_m = inputs(3584, "random", "column", seed=3)
    s_out = torch.tensor([OUTPUT_SCALE], device="cuda")
    out = fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, expected_rows=13)
    graph_out = torch.empty_like(out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, graph_out, expected_rows=13, check=False)
    graph.replay()
    torch.cuda.synchronize()
    for e, m in enumerate(masked_m.tolist()):
        assert torch.equal(graph_out[e, :m].view(torch.uint8), out[e, :m].view(torch.uint8))
