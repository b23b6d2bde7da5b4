"""The dispatch decision per expert block, as the C++ makes it (route_plan runs the kernel's own
routing and predicate), under each policy."""

from __future__ import annotations

import pytest
import torch
from cpu_brgemm_helpers import machine_target, make_kernel, runnable_isas
from hal.backends.cpu_brgemm.policy import BLOCK_M, BLOCK_N, BRGEMM_MIN_ROWS, POLICIES

from hal import synth
from hal.spec import MoESpec

pytestmark = pytest.mark.cpu

SPEC = MoESpec(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64,
               weight_format="fp8_block128")


def _kernel():
    return make_kernel(SPEC, machine_target(), runnable_isas()[-1])


def _paths(ids, policy, supported, expert_map=None, local=None):
    kernel = _kernel()
    rows = kernel.ops.route_plan(ids, expert_map, local or SPEC.local_experts, POLICIES.index(policy),
                                 supported, kernel.max_chunk_tokens).tolist()
    return [(e, m, n, ("tiny", "brgemm")[p1], ("tiny", "brgemm")[p2]) for e, _, m, n, p1, p2 in rows]


# Routes per expert for 33 tokens x top_k 2: blocks either side of the threshold, one expert over
# two blocks (32 + 1), empty experts.
COUNTS = [4, 5, 33, 0, 6, 0, 2, 16]


def _counts_ids(counts, tokens):
    return synth.random_routing(SPEC, tokens, mode="counts", counts=counts, seed=1)[1]


def test_per_block_threshold_and_block_split():
    ids = _counts_ids(COUNTS, 33)
    got = _paths(ids, "per_block", True)
    assert [(e, m) for e, m, *_ in got] == [(0, 4), (1, 5), (2, BLOCK_M), (2, 1), (4, 6), (6, 2), (7, 16)]
    for e, m, n, p1, p2 in got:
        want = "brgemm" if m > BRGEMM_MIN_ROWS else "tiny"
        assert (n, p1, p2) == (BLOCK_N, want, want), (e, m)


def test_per_block_without_brgemm_is_all_tiny():
    ids = _counts_ids(COUNTS, 33)
    assert {p for *_, p, _ in _paths(ids, "per_block", False)} == {"tiny"}


def test_global_uses_the_layer_average():
    # 33 tokens x 2 / 8 experts: avg_M = 8 > 4, so every block goes to BRGEMM, the 1-row one too.
    ids = _counts_ids(COUNTS, 33)
    assert {p for *_, p, _ in _paths(ids, "global", True)} == {"brgemm"}
    # Concentrated: 32 routes on two experts (avg_M = 4) stay on TinyGEMM under global ...
    ids = torch.tensor([[0, 1]] * 16, dtype=torch.int32)
    assert [p for *_, p, _ in _paths(ids, "global", True)] == ["tiny", "tiny"]
    # ... while per_block sends both 16-row blocks to BRGEMM.
    assert [p for *_, p, _ in _paths(ids, "per_block", True)] == ["brgemm", "brgemm"]


def test_forced_policies():
    ids = _counts_ids(COUNTS, 33)
    assert {p for *_, p, _ in _paths(ids, "tiny", True)} == {"tiny"}
    if "avx512bf16" in runnable_isas():
        assert {p for *_, p, _ in _paths(ids, "brgemm", False)} == {"brgemm"}


def test_ep_routes_off_rank_make_no_blocks():
    spec = MoESpec(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64,
                   weight_format="fp8_block128", num_local_experts=2)
    expert_map = torch.tensor([-1, 0, -1, -1, 1, -1, -1, -1], dtype=torch.int32)
    ids = torch.tensor([[1, 2], [3, 5], [4, 1], [0, 7]], dtype=torch.int32)
    kernel = make_kernel(spec, machine_target(), runnable_isas()[-1])
    plan = kernel.plan(ids, expert_map=expert_map)
    assert [(b.expert, b.m_size) for b in plan.blocks] == [(0, 2), (1, 1)]
    assert plan.local_routes == 3
    assert "3 local routes in 2 blocks" in plan.describe()
    # Without a map (hal select), the plan takes this rank as experts [0, 2) and says so.
    assumed = kernel.plan(ids)
    assert [(b.expert, b.m_size) for b in assumed.blocks] == [(0, 1), (1, 2)]
    assert assumed.assumed_expert_map and "no expert_map given" in assumed.describe()
    with pytest.raises(ValueError, match="expert_map"):
        kernel.plan(ids, expert_map=torch.zeros(8, dtype=torch.int64))


def test_plan_rejects_bad_ids():
    kernel = _kernel()
    with pytest.raises(ValueError, match="topk_ids"):
        kernel.plan(torch.zeros(3, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\[0, 8\)"):
        kernel.plan(torch.full((3, 2), 8, dtype=torch.int32))


def test_policy_names_and_baseline():
    kernel = _kernel()
    assert kernel.policy == "per_block"
    baselines = kernel.baselines()
    assert list(baselines) == ["global"] and baselines["global"].policy == "global"
    with pytest.raises(ValueError, match="policy='fast'"):
        kernel.with_policy("fast")
    if "avx2" in runnable_isas():
        with pytest.raises(ValueError, match="avx512bf16"):
            make_kernel(SPEC, machine_target(), "avx2", policy="brgemm")
