"""One rank of an expert-parallel test: `python ep_worker.py SCENARIO RANK WORLD PORT [BACKENDS]`
(BACKENDS: comma-separated local backends, default "reference").
Every rank regenerates every rank's inputs deterministically, so each can check its own output against
the single-process reference and its received rows against what the other ranks sent. Prints
"PASS <scenario> <case>" per checked case; any failure is a traceback and a nonzero exit."""

from __future__ import annotations

import datetime
import sys
import time

import attrs
import torch
import torch.distributed as dist
from hal.backends.reference import ops

import hal
from hal.distributed import CollectiveError, EPGroup, ExpertAssignment, combine_masked, dispatch_masked
from hal.spec import TOKEN_GROUP
from hal.synth import random_routing, random_tokens, random_weights
from hal.testing import ACCURACY, live_cpu_caps, poison, rel_err

GROUP_TIMEOUT = datetime.timedelta(seconds=60)
TOKENS = (5, 7, 3, 9)  # per rank: uneven
UNEVEN = (0, 11, 1, 4)  # rank 0 has no token


def spec_of(fmt="bf16", activation="silu", bias=False):
    return hal.MoESpec(num_experts=8, top_k=3, hidden_size=64, intermediate_size=96, weight_format=fmt,
                       activation=activation, has_bias=bias)


def inputs(spec, rank, tokens, routing, case_seed, assignment):
    """Rank `rank`'s (x, topk_weights, topk_ids) for one case."""
    M = tokens[rank]
    seed = 1000 * case_seed + rank
    x = random_tokens(spec, M, seed=seed)
    if routing == "skewed":
        tw, ti = random_routing(spec, M, mode="one_expert", hot_expert=5, seed=seed)
    elif routing == "last_rank_idle":  # no route reaches the last rank's experts
        scores = torch.rand(M, spec.num_experts, generator=torch.Generator().manual_seed(seed))
        scores[:, list(assignment.experts[-1])] = -1.0
        ti = scores.topk(spec.top_k, dim=1).indices.to(torch.int32)
        tw = torch.softmax(torch.randn(M, spec.top_k, generator=torch.Generator().manual_seed(seed)), -1)
    else:
        tw, ti = random_routing(spec, M, seed=seed)
    if routing == "dropped" and M:
        drop = torch.rand(ti.shape, generator=torch.Generator().manual_seed(seed + 7)) < 0.3
        ti = torch.where(drop, torch.full_like(ti, -1), ti)
        ti[0] = -1  # a token with no route at all
    return x, tw, ti


def check_layer(group, world, rank, backend, name, spec, routing="uniform", tokens=TOKENS, assignment=None,
                local_weights=False, case_seed=0):
    assignment = assignment or ExpertAssignment.contiguous(spec.num_experts, world)
    weights = random_weights(spec, seed=case_seed)
    kernel = hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer=backend,
                                   group=EPGroup(group, assignment=assignment))
    assert kernel.backend == f"ep:{backend}", kernel.backend
    if local_weights:  # this rank's experts only, in reverse order, with the map saying so
        mine = list(assignment.experts[rank])[::-1]
        expert_map = torch.full((spec.num_experts,), -1, dtype=torch.int32)
        expert_map[mine] = torch.arange(len(mine), dtype=torch.int32)
        index = torch.tensor(mine)
        picked = {f: getattr(weights, f)[index] for f in ("w13", "w2", "w13_scale", "w2_scale", "b13", "b2")
                  if getattr(weights, f) is not None}
        prepared = kernel.prepare_weights(attrs.evolve(weights, expert_map=expert_map, **picked))
    else:
        prepared = kernel.prepare_weights(weights)
    everyone = [inputs(spec, r, tokens, routing, case_seed, assignment) for r in range(world)]
    x, tw, ti = everyone[rank]

    plan = kernel.plan(ti)
    mine = torch.tensor(assignment.experts[rank])
    routes_here = sum(int(torch.isin(t, mine).sum()) for _, _, t in everyone)
    assert plan.routes_computed == routes_here, (plan.routes_computed, routes_here)
    rows_from = [int(torch.isin(t, mine).any(1).sum()) for _, _, t in everyone]
    assert list(plan.rows_received) == rows_from, (plan.rows_received, rows_from)
    assert "rows sent per rank" in plan.describe()

    out = poison(torch.empty_like(x))
    got = kernel(x, tw, ti, prepared, out=out)
    assert got is out and not torch.isnan(out).any(), "an output row was left unwritten"
    oracle = ops.moe_tokens(spec, x, tw, ti, weights, compute_dtype=torch.float64)
    single = hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer="reference")
    single_out = single(x, tw, ti, single.prepare_weights(weights), check=False)
    for what, ref in (("float64 oracle", oracle), ("single-process reference", single_out)):
        err = rel_err(out, ref)
        assert err <= ACCURACY, f"{name}: rel err {err:.3e} against the {what}"
    dead = (ti < 0).all(dim=1)
    assert bool((out[dead] == 0).all()), "a token without routes must get zeros"
    print(f"PASS layer {backend} {name} rank {rank} M={x.shape[0]} rows_received={rows_from}", flush=True)


def layer(group, world, rank, backend):
    check_layer(group, world, rank, backend, "uniform", spec_of(), case_seed=1)
    check_layer(group, world, rank, backend, "skewed", spec_of(), routing="skewed", case_seed=2)
    check_layer(group, world, rank, backend, "uneven_with_empty_rank", spec_of(), tokens=UNEVEN, case_seed=3)
    check_layer(group, world, rank, backend, "dropped_routes", spec_of(), routing="dropped", case_seed=4)
    check_layer(group, world, rank, backend, "swiglu_oai_bias_mxfp4",
                spec_of("mxfp4", "swiglu_oai", bias=True), routing="dropped", case_seed=5)
    if world > 1:
        scattered = ExpertAssignment.explicit(8, [list(range(r, 8, world)) for r in range(world)])
        check_layer(group, world, rank, backend, "rank_receives_nothing", spec_of(),
                    routing="last_rank_idle", assignment=scattered, local_weights=True, case_seed=6)


def masked(group, world, rank, backend):
    spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                       weight_format="w4afp8", layout="masked")
    assignment = ExpertAssignment.contiguous(8, world)
    weights = random_weights(spec, seed=11)
    groups = spec.hidden_size // TOKEN_GROUP

    def tokens_of(r):
        g = torch.Generator().manual_seed(500 + r)
        M = UNEVEN[r]
        xq = (torch.randn(M, spec.hidden_size, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
        scale = torch.rand(M, groups, generator=g) * 0.01 + 0.01
        tw, ti = random_routing(spec, M, seed=600 + r)
        if M:
            ti[0, 1] = -1
        return xq, scale, tw, ti

    everyone = [tokens_of(r) for r in range(world)]
    xq, scale, tw, ti = everyone[rank]
    layout = dispatch_masked(group, xq, tw, ti, num_experts=8, x_scale=scale)
    # The layout holds, per local expert, every route's row from rank 0's tokens up, byte for byte.
    for e, g_id in enumerate(assignment.experts[rank]):
        want_x = torch.cat([x[(t == g_id).any(1)] for x, _, _, t in everyone])
        want_s = torch.cat([s[(t == g_id).any(1)] for _, s, _, t in everyone])
        m = int(layout.masked_m[e])
        assert m == want_x.shape[0], (e, m, want_x.shape[0])
        assert torch.equal(layout.x[e, :m].view(torch.uint8), want_x.view(torch.uint8))
        assert torch.equal(layout.x_scale[e, :m], want_s)
    local_spec = attrs.evolve(spec, num_local_experts=assignment.local_count(rank))
    expert_kernel = hal.select_moe_kernel(local_spec, "cpu", caps=live_cpu_caps(), prefer=backend)
    index = torch.tensor(assignment.experts[rank])
    local = attrs.evolve(weights, w13=weights.w13[index], w2=weights.w2[index],
                         w13_scale=weights.w13_scale[index], w2_scale=weights.w2_scale[index],
                         expert_map=assignment.expert_map(rank))
    prepared = expert_kernel.prepare_weights(local)
    expert_out = expert_kernel(layout.x, layout.x_scale, layout.masked_m, prepared)
    out = combine_masked(layout, expert_out)

    # References: this rank's tokens in a single-process masked layout over all experts, run by the
    # reference masked kernel (same precision as the local one) and by the float64 oracle. The
    # oracle's bound is the reference kernel's own (tests/reference): the FP8 requant between the
    # GEMMs flips a rounding here and there against float64.
    per_expert = [torch.nonzero((ti == e).any(1)).flatten() for e in range(8)]
    height = max([len(p) for p in per_expert] + [1])
    gx = torch.zeros(8, height, spec.hidden_size).to(torch.float8_e4m3fn)
    gs = torch.ones(8, height, groups)
    for e, rows in enumerate(per_expert):
        gx[e, : len(rows)], gs[e, : len(rows)] = xq[rows], scale[rows]
    gm = torch.tensor([len(p) for p in per_expert], dtype=torch.int32)
    single = hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer="reference")
    oracle = ops.moe_masked(spec, gx, gs, gm, weights, torch.zeros(gx.shape, dtype=torch.float64),
                            compute_dtype=torch.float64)
    checks = (("single-process reference", single(gx, gs, gm, single.prepare_weights(weights)), ACCURACY),
              ("float64 oracle", oracle, 2 * ACCURACY))
    for what, y, bound in checks:
        ref = torch.zeros(xq.shape[0], spec.hidden_size, dtype=torch.float64)
        for e, rows in enumerate(per_expert):
            slot = (ti[rows] == e).int().argmax(1)
            ref[rows] += tw[rows, slot].double().unsqueeze(1) * y[e, : len(rows)].double()
        err = rel_err(out, ref)
        assert out.dtype == torch.bfloat16 and err <= bound, f"masked: rel err {err:.3e} against the {what}"
    print(f"PASS masked rank {rank} masked_m={layout.masked_m.tolist()}", flush=True)


def invalid(group, world, rank, backend):
    spec = spec_of()
    kernel = hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer=backend, group=group)
    prepared = kernel.prepare_weights(random_weights(spec, seed=3))
    x, tw, ti = inputs(spec, rank, TOKENS, "uniform", 9, kernel.comm.assignment)
    bad = ti.clone()
    if rank == 1:
        bad[0, 0] = spec.num_experts  # out of range on one rank only
    try:
        kernel(x, tw, bad, prepared)
    except ValueError as exc:
        assert "topk_ids" in str(exc) and "rank 1" in str(exc), str(exc)
        print(f"PASS invalid rank {rank} raised: {exc}", flush=True)
    else:
        raise AssertionError(f"rank {rank}: no ValueError for another rank's bad topk_ids")
    # The group is still in step: the next (valid) call runs on every rank.
    out = kernel(x, tw, ti, prepared)
    assert not torch.isnan(out).any()
    print(f"PASS invalid rank {rank} recovered", flush=True)
    # Unchecked, an out-of-range id is dropped like -1: nothing is read out of bounds.
    unchecked = kernel(x, tw, bad, prepared, check=False)
    dropped = torch.where(bad >= spec.num_experts, torch.full_like(bad, -1), bad)
    want = ops.moe_tokens(spec, x, tw, dropped, random_weights(spec, seed=3), compute_dtype=torch.float64)
    assert rel_err(unchecked, want) <= ACCURACY
    # Ranks built for different layers: every rank refuses before any row moves.
    other = attrs.evolve(spec, intermediate_size=64) if rank == 1 else spec
    mismatched = hal.select_moe_kernel(other, "cpu", caps=live_cpu_caps(), prefer=backend, group=group)
    try:
        mismatched(x, tw, ti, mismatched.prepare_weights(random_weights(other, seed=3)))
    except ValueError as exc:
        assert "disagree on the layer" in str(exc), str(exc)
    else:
        raise AssertionError(f"rank {rank}: no ValueError for ranks built with different specs")
    # A masked buffer too short for the busiest expert: every rank refuses, none waits.
    try:
        dispatch_masked(group, x, tw, ti, num_experts=spec.num_experts, max_m=1)
    except ValueError as exc:
        assert str(exc).startswith("max_m=1 is too small"), str(exc)
    else:
        raise AssertionError(f"rank {rank}: no ValueError for max_m=1")
    print(f"PASS invalid rank {rank} mismatched spec and short max_m", flush=True)


def timeout(group, world, rank, backend):
    spec = spec_of()
    kernel = hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer=backend,
                                   group=EPGroup(group, timeout=datetime.timedelta(seconds=2)))
    prepared = kernel.prepare_weights(random_weights(spec, seed=3))
    x, tw, ti = inputs(spec, rank, TOKENS, "uniform", 9, kernel.comm.assignment)
    if rank == 0:
        start = time.monotonic()
        try:
            kernel(x, tw, ti, prepared)
        except CollectiveError as exc:
            assert exc.step == "combine" and "timed out" in str(exc), str(exc)
            print(f"PASS timeout rank 0 after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        else:
            raise AssertionError("rank 0 finished a combine that rank 1 never joined")
    else:
        kernel.dispatch(x, tw, ti, prepared)  # then never combines
        time.sleep(8)  # well past rank 0's 2 s timeout, so rank 0 sees a timeout, not a closed peer
        print("PASS timeout rank 1 left without combining", flush=True)


def expert_counts(group, world, rank, backend):
    """Rank 1 is built for 6 experts, rank 0 for 8: every entry point raises ValueError on both
    ranks (none aborts in a collective of mismatched size), and the group stays in step."""
    spec = spec_of()
    mine = attrs.evolve(spec, num_experts=6) if rank == 1 else spec
    x = random_tokens(mine, TOKENS[rank], seed=rank)
    tw, ti = random_routing(mine, TOKENS[rank], seed=rank)
    kernel = hal.select_moe_kernel(mine, "cpu", caps=live_cpu_caps(), prefer=backend, group=group)
    prepared = kernel.prepare_weights(random_weights(mine, seed=3))
    calls = {"layer": lambda: kernel(x, tw, ti, prepared),
             "dispatch": lambda: kernel.dispatch(x, tw, ti, prepared),
             "plan": lambda: kernel.plan(ti),
             "dispatch_masked": lambda: dispatch_masked(group, x, tw, ti, num_experts=mine.num_experts),
             "dispatch_masked unchecked": lambda: dispatch_masked(group, x, tw, ti, check=False,
                                                                  num_experts=mine.num_experts)}
    for name, call in calls.items():
        try:
            call()
        except ValueError as exc:
            assert "num_experts per rank [8, 6]" in str(exc), f"{name}: {exc}"
            print(f"PASS expert_counts {name} rank {rank} raised: {exc}", flush=True)
        else:
            raise AssertionError(f"rank {rank}: {name} ran with ranks disagreeing on num_experts")
    agreed = hal.select_moe_kernel(spec, "cpu", caps=live_cpu_caps(), prefer=backend, group=group)
    x, tw, ti = inputs(spec, rank, TOKENS, "uniform", 9, agreed.comm.assignment)
    out = agreed(x, tw, ti, agreed.prepare_weights(random_weights(spec, seed=3)))
    assert not torch.isnan(out).any()
    print(f"PASS expert_counts rank {rank} recovered", flush=True)


def everything(group, world, rank, backends):
    """The layer on each local backend and the masked form; at world size 2 also the failure
    cases, the timeout last since it leaves the group out of step."""
    for backend in backends.split(","):
        layer(group, world, rank, backend)
    masked(group, world, rank, "reference")
    if world == 2:
        invalid(group, world, rank, "reference")
        timeout(group, world, rank, "reference")


def nccl_single(group, world, rank, backend):
    """World size 1 on NCCL: the same layer on cuda:0, the reference as the local kernel."""
    spec = spec_of("bf16")
    weights = random_weights(spec, seed=1, device="cuda:0")
    kernel = hal.select_moe_kernel(spec, "cuda:0", prefer="reference", group=group)
    prepared = kernel.prepare_weights(weights)
    x, tw, ti = (t.to("cuda:0") for t in inputs(spec, 0, (33,), "dropped", 1, kernel.comm.assignment))
    assert kernel.plan(ti).rows_received == (int((ti >= 0).any(1).sum()),)
    out = kernel(x, tw, ti, prepared)
    oracle = ops.moe_tokens(spec, x.cpu(), tw.cpu(), ti.cpu(), random_weights(spec, seed=1),
                            compute_dtype=torch.float64)
    err = rel_err(out.cpu(), oracle)
    assert err <= ACCURACY, f"nccl: rel err {err:.3e}"
    print(f"PASS nccl rank {rank} rel err {err:.2e}", flush=True)


SCENARIOS = {"everything": everything, "expert_counts": expert_counts, "nccl_single": nccl_single}


def main():
    scenario, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    backend = sys.argv[5] if len(sys.argv) > 5 else "reference"
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if scenario.startswith("nccl") else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=GROUP_TIMEOUT)
    SCENARIOS[scenario](dist.group.WORLD, world, rank, backend)
    if scenario != "everything" or world != 2:  # the timeout case leaves the group out of step
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
