"""Expert parallelism across processes: every test spawns its ranks as separate processes on
127.0.0.1 (gloo on CPU), each bounded by a timeout so a hang fails instead of stalling CI. The ranks
check their own results (tests/distributed/ep_worker.py) against the single-process reference."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hal
from hal.distributed import EPGroup, ExpertAssignment
from hal.testing import live_cpu_caps

pytestmark = pytest.mark.cpu

WORKER = Path(__file__).with_name("ep_worker.py")
RANKS_TIMEOUT_S = 240  # a guard against hangs, far above a run on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario: str, world: int, backends: str = "reference") -> list:
    """Each rank's output; fails with every rank's log if one exits nonzero or they outlive the
    timeout."""
    port = free_port()
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    command = [sys.executable, str(WORKER), scenario, "RANK", str(world), str(port), backends]
    procs = [subprocess.Popen([str(r) if a == "RANK" else a for a in command], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    logs, hung = [], False
    for p in procs:
        try:
            logs.append(p.communicate(timeout=RANKS_TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            hung = True
            for q in procs:
                q.kill()
            logs.append(p.communicate()[0])
    codes = [p.returncode for p in procs]
    report = "\n".join(f"--- rank {r} (exit {c})\n{log}"
                       for r, (c, log) in enumerate(zip(codes, logs, strict=True)))
    assert not hung, f"{scenario}: ranks still running after {RANKS_TIMEOUT_S} s\n{report}"
    assert codes == [0] * world, f"{scenario} failed\n{report}"
    return logs


@pytest.fixture(scope="module")
def cpu_brgemm_built():
    """Build cpu_brgemm's extension once here, so the ranks load it from the cache instead of
    compiling it side by side."""
    spec = hal.MoESpec(num_experts=8, top_k=1, hidden_size=64, intermediate_size=96, num_local_experts=2)
    hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer="cpu_brgemm").compile()


_RUNS = {}


def ranks_of(world: int) -> list:
    """The logs of one run of every case at this world size (ranks start once per world size:
    process start-up is most of the cost on a small machine)."""
    if world not in _RUNS:
        _RUNS[world] = run_ranks("everything", world, "reference,cpu_brgemm")
    return _RUNS[world]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_layer_matches_single_process_reference(world, cpu_brgemm_built):
    cases = 5 + (world > 1)
    for log in ranks_of(world):
        for backend in ("reference", "cpu_brgemm"):
            assert log.count(f"PASS layer {backend} ") == cases, log
        assert log.count("PASS masked ") == 1, log


def test_invalid_input_on_one_rank_raises_on_every_rank(cpu_brgemm_built):
    logs = ranks_of(2)
    assert "another rank (rank 1: topk_ids)" in logs[0]
    assert "topk_ids holds values in [0, 8]" in logs[1]
    assert all("recovered" in log and "mismatched spec and short max_m" in log for log in logs)


def test_a_rank_that_never_combines_times_out_the_others_naming_the_step(cpu_brgemm_built):
    logs = ranks_of(2)
    assert "PASS timeout rank 0" in logs[0]
    assert "expert-parallel combine timed out on rank 0" in logs[0]


def test_ranks_disagreeing_on_num_experts_raise_on_every_rank():
    logs = run_ranks("expert_counts", 2)
    for rank, log in enumerate(logs):
        for call in ("layer", "dispatch", "plan", "dispatch_masked", "dispatch_masked unchecked"):
            assert f"PASS expert_counts {call} rank {rank} raised" in log, log
        assert f"PASS expert_counts rank {rank} recovered" in log, log


@pytest.mark.cuda
def test_nccl_world_size_one():
    run_ranks("nccl_single", 1)


def test_contiguous_assignment_balances_and_maps():
    a = ExpertAssignment.contiguous(10, 4)
    assert a.experts == ((0, 1, 2), (3, 4, 5), (6, 7), (8, 9))
    assert a.expert_map(1).tolist() == [-1, -1, -1, 0, 1, 2, -1, -1, -1, -1]
    owner, local = a.tables("cpu")
    assert owner.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert local.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 0, 1]


@pytest.mark.parametrize("experts, message", [
    ([[0, 1], [1, 2, 3]], "exactly one rank"),
    ([[0, 1, 2, 3], []], "ranks \\[1\\] own no expert"),
    ([[0, 1], [2]], "exactly one rank"),
])
def test_explicit_assignment_rejects_gaps_overlaps_and_idle_ranks(experts, message):
    with pytest.raises(ValueError, match=f"^assignment: .*{message}"):
        ExpertAssignment.explicit(4, experts)


def test_group_without_torch_distributed_names_the_group():
    spec = hal.MoESpec(num_experts=4, top_k=2, hidden_size=64, intermediate_size=64)
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="^group: torch.distributed is not initialized"):
        hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer="reference",
                              group=EPGroup(object()))


def _rank_kernel(rank: int, world: int, spec):
    """Rank `rank`'s kernel without a live group: prepare_weights runs no collective."""
    from hal.distributed.group import Comm
    from hal.distributed.kernel import ExpertParallelKernel, local_spec

    assignment = ExpertAssignment.contiguous(spec.num_experts, world)
    comm = Comm(None, rank, world, "gloo", torch.device("cpu"), assignment, None)
    local = hal.select_moe_kernel(local_spec(spec, assignment.local_count(rank)), "cpu",
                                  caps=live_cpu_caps(), prefer="reference")
    return ExpertParallelKernel(spec, comm, local)


def test_prepare_weights_keeps_the_ranks_slice_from_all_or_from_its_own_experts():
    import attrs

    from hal.synth import random_weights

    spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32, has_bias=True)
    kernel = _rank_kernel(1, 2, spec)  # experts 4..7
    weights = random_weights(spec, seed=1)
    from_all = kernel.prepare_weights(weights).data.data  # the reference's dequantized experts
    assert torch.equal(from_all["w13"], weights.w13[4:])
    assert torch.equal(from_all["b2"], weights.b2[4:].float())
    assert from_all["weights"].expert_map.tolist() == [0, 1, 2, 3, -1, -1, -1, -1]
    reverse = [7, 6, 5, 4]
    expert_map = torch.full((8,), -1, dtype=torch.int32)
    expert_map[reverse] = torch.arange(4, dtype=torch.int32)
    own = attrs.evolve(weights, w13=weights.w13[reverse], w2=weights.w2[reverse], b13=weights.b13[reverse],
                       b2=weights.b2[reverse], expert_map=expert_map)
    from_own = kernel.prepare_weights(own).data.data
    assert torch.equal(from_own["w13"], weights.w13[4:])
    assert torch.equal(from_own["b13"], weights.b13[4:].float())
    with pytest.raises(ValueError, match="^weights.w13 holds 4 experts and there is no expert_map"):
        kernel.prepare_weights(attrs.evolve(own, expert_map=None))
    wrong = torch.full((8,), -1, dtype=torch.int32)
    wrong[:4] = torch.arange(4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^weights.expert_map holds experts \[0, 1, 2, 3\]: rank 1 owns"):
        kernel.prepare_weights(attrs.evolve(own, expert_map=wrong))
