"""The Marlin MoE kernels on an NVIDIA GPU against hal.backends.reference (float64): every compiled
config, the routing op, the fused epilogues at every K split, and the whole layer over token
counts, activations, dtypes, group sizes, bias and expert parallelism. Outputs are poisoned before
each run."""

from __future__ import annotations

import functools
import itertools
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from hal.backends.marlin import configs, repack
from hal.backends.marlin.kernel import MarlinMoEKernel
from hal.backends.reference import dequant, ops

import hal
from hal.backend import Target
from hal.bench.timing import capture_graph
from hal.synth import random_expert_map, random_routing, random_tokens, random_weights
from hal.testing import poison

pytestmark = pytest.mark.cuda

REL_TOL = 1e-2
DEVICE = "cuda:0"


@functools.cache
def cuda_target() -> Target:
    return Target(DEVICE, hal.probe(deep=True))


def kernel_for(spec, **kw) -> MarlinMoEKernel:
    return MarlinMoEKernel(spec, cuda_target(), **kw)


def weights_for(spec, seed):
    w = random_weights(spec, device=DEVICE, seed=seed)
    if spec.is_ep:
        w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=seed, device=DEVICE))
    return w


def rel_err(out, ref):
    ref = ref.double()
    denom = ref.norm()
    if denom == 0:
        return float(out.double().norm())
    return float((out.double() - ref).norm() / denom)


def run_layer(spec, m, routing="uniform", seed=0, kernel=None, ids_dtype=torch.int32,
              weights_dtype=torch.float32):
    kernel = kernel or kernel_for(spec)
    w = weights_for(spec, seed)
    prepared = kernel.prepare_weights(w)
    x = random_tokens(spec, m, seed=seed + 1, device=DEVICE)
    tw, ti = random_routing(spec, m, routing, seed=seed + 2, device=DEVICE)
    tw, ti = tw.to(weights_dtype), ti.to(ids_dtype)
    out = poison(torch.empty_like(x))
    kernel(x, tw, ti, prepared, out=out)
    torch.cuda.synchronize()
    ref = ops.moe_tokens(spec, x, tw.float(), ti, w, compute_dtype=torch.float64)
    assert torch.isfinite(out).all(), "some output element was never written (poison left)"
    err = rel_err(out, ref)
    assert err <= REL_TOL, f"rel err {err:.3g} for {spec} m={m} {routing}"
    local = ops.local_ids(spec, ti, w.expert_map)
    idle = ~(local >= 0).any(dim=1)  # tokens all of whose experts live on other ranks
    assert (out[idle] == 0).all()
    return out


SPECS = {
    "bf16-silu-g128": hal.MoESpec(8, 2, 256, 384, "int4_g128"),
    "bf16-swiglu-g128-ep-bias": hal.MoESpec(64, 4, 512, 256, "int4_g128", "swiglu_oai", has_bias=True,
                                            num_local_experts=24),
    "fp16-relu2-channel-ep": hal.MoESpec(256, 8, 384, 640, "int4_g128", "relu2", num_local_experts=40,
                                         act_dtype="float16", group_size=-1),
    "fp16-silu-g128-bias": hal.MoESpec(16, 1, 1024, 128, "int4_g128", has_bias=True,
                                       act_dtype="float16"),
    "bf16-silu-channel": hal.MoESpec(128, 8, 2048, 192, "int4_g128", group_size=-1),
}
CASES = [
    ("bf16-silu-g128", (1, 7, 16, 123, 2304)),
    ("bf16-swiglu-g128-ep-bias", (1, 16, 123)),
    ("fp16-relu2-channel-ep", (7, 2304)),
    ("fp16-silu-g128-bias", (1, 123)),
    ("bf16-silu-channel", (16, 123)),
]


@pytest.mark.parametrize("name,m", [(n, m) for n, ms in CASES for m in ms])
def test_layer_matches_reference(name, m):
    run_layer(SPECS[name], m, seed=m)


@pytest.mark.parametrize("routing", ["one_expert", "concentrated", "counts"])
def test_skewed_routings(routing):
    spec = SPECS["bf16-silu-g128"]
    if routing == "counts":  # two experts take every route, six stay empty
        kernel = kernel_for(spec)
        w = weights_for(spec, 3)
        prepared = kernel.prepare_weights(w)
        x = random_tokens(spec, 123, seed=4, device=DEVICE)
        tw, ti = random_routing(spec, 123, "counts", seed=5, device=DEVICE,
                                counts=[123, 0, 0, 0, 0, 0, 0, 123])
        out = poison(torch.empty_like(x))
        kernel(x, tw, ti, prepared, out=out)
        ref = ops.moe_tokens(spec, x, tw, ti, w, compute_dtype=torch.float64)
        assert rel_err(out, ref) <= REL_TOL
    else:
        run_layer(spec, 123, routing, seed=11)


@pytest.mark.parametrize("name", ["bf16-silu-g128", "bf16-swiglu-g128-ep-bias"])
@pytest.mark.parametrize("variant", ["first_valid", "runtime_branch"])
def test_baselines_are_correct(name, variant):
    spec = SPECS[name]
    kernel = kernel_for(spec, policy="first_valid") if variant == "first_valid" \
        else kernel_for(spec, runtime_branch=True)
    for m in (1, 123):
        run_layer(spec, m, seed=20 + m, kernel=kernel)


def test_int64_ids_and_bf16_topk_weights():
    spec = SPECS["bf16-silu-g128"]
    run_layer(spec, 16, seed=5, ids_dtype=torch.int64, weights_dtype=torch.bfloat16)


def test_every_compiled_config_and_split():
    """Each GEMM config on its own, in both output modes: GEMM-1 style (A row = route / top_k, one
    stored partial per K split) and GEMM-2 style (weighted routes summed into their token's row by
    atomics), with a grid smaller than the block count so the block-walking loop runs."""
    spec = SPECS["bf16-silu-g128"]
    kernel = kernel_for(spec)
    op = kernel.loaded_ops()
    E, K, N, tokens, top_k = 4, 256, 512, 37, 2
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-2**31, 2**31 - 1, (E, K // 8, N), generator=g, dtype=torch.int64).to(torch.int32)
    s = ((torch.rand(E, K // 128, N, generator=g) + 0.5) / 32).to(torch.bfloat16)
    w = dequant.uint4b8(q, s, torch.float64)  # [E, N, K]
    a = torch.randn(tokens, K, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    rw = torch.rand(tokens * top_k, generator=g)
    routes = tokens * top_k
    per_route = torch.stack([a[r // top_k].double() @ w[ids.view(-1)[r]].T for r in range(routes)])
    per_token = (per_route * rw.double().unsqueeze(1)).view(tokens, top_k, N).sum(1)
    packed, s_d, a_d, ids_d = repack.repack(q).to(DEVICE), s.to(DEVICE), a.to(DEVICE), ids.to(DEVICE)
    rw_d = rw.to(DEVICE)
    failures = []
    compiled = kernel.kernel_attributes()
    for cfg in (c for c in configs.candidates() if c.index in compiled):
        sorted_routes, block_expert, num_blocks, _ = op.route(ids_d, None, E, cfg.block_m)
        for splits in (1, 2):
            if K % (splits * cfg.thread_k):
                continue
            parts = torch.full((splits, routes, N), float("nan"), device=DEVICE)
            op.gemm(a_d, top_k, packed, s_d, 128, None, None, sorted_routes, block_expert, num_blocks,
                    parts, 1, False, routes, 3, cfg.index, splits)
            summed = torch.zeros(tokens, N, device=DEVICE)
            op.gemm(a_d, top_k, packed, s_d, 128, None, rw_d, sorted_routes, block_expert, num_blocks,
                    summed, top_k, True, routes, 3, cfg.index, splits)
            for mode, got, want in (("stored", parts.sum(0), per_route), ("atomic", summed, per_token)):
                err = rel_err(got.cpu(), want)
                if not torch.isfinite(got).all() or err > REL_TOL:
                    failures.append(f"{cfg.describe()} splits {splits} {mode}: rel err {err:.3g}")
    assert not failures, failures


@pytest.mark.parametrize("activation", ["silu", "swiglu_oai", "relu2"])
def test_fused_epilogues_at_every_k_split(activation):
    """The layer with its configs forced, at every K split of both GEMMs and every fusion: GEMM 1
    activates in registers (one K split) or in the last K split of each tile to arrive, GEMM 2
    rounds each token's sums in its last arrival or the rounding kernel does, or both the
    activation and the rounding are kernels of their own; with a grid smaller than the block count,
    tokens whose routes all go to other ranks or are dropped (-1), and bias."""
    from hal.backends.marlin.kernel import ACTIVATION_CODES

    spec = hal.MoESpec(64, 4, 1024, 512, "int4_g128", activation, has_bias=True, num_local_experts=24)
    kernel = kernel_for(spec)
    op = kernel.loaded_ops()
    w = weights_for(spec, 31)
    data = kernel.prepare_weights(w).data
    failures = []
    for m in (1, 37):
        x = random_tokens(spec, m, seed=m, device=DEVICE)
        tw, ti = random_routing(spec, m, seed=m + 1, device=DEVICE)
        ti = ti.to(torch.int32)
        ti[::3, 1] = -1  # dropped routes
        local = ops.local_ids(spec, ti, w.expert_map)
        if m > 1:  # one token routed only to other ranks' experts
            remote = (w.expert_map < 0).nonzero().flatten()[: spec.top_k].to(torch.int32)
            ti[m // 2] = remote
            local = ops.local_ids(spec, ti, w.expert_map)
            assert not (local[m // 2] >= 0).any()
        ref = ops.moe_tokens(spec, x, tw.float(), ti, w, compute_dtype=torch.float64)
        compiled = kernel.kernel_attributes()
        for cfg in (c for c in configs.candidates() if c.index in compiled and c.describe() in (
                "m8 k64 n256 t128 s3", "m16 k128 n64 t128 s4", "m48 k64 n256 t256 s4 wgmma",
                "m48 k64 n256 t128 s3 wgmma", "m64 k64 n256 t256 s4 wgmma",
                "m64 k64 n256 t128 s3 wgmma")):
            for s13, s2, fusion in itertools.product(configs.split_options(cfg, spec.hidden_size),
                                                     configs.split_options(cfg, spec.intermediate_size),
                                                     range(len(configs.FUSIONS))):
                out = poison(torch.empty_like(x))
                op.moe(x, tw.float().contiguous(), ti, data.w13, data.s13, data.w2, data.s2, data.b13,
                       data.b2, data.expert_map, out, spec.num_experts, spec.intermediate_size,
                       data.group13, data.group2, cfg.index, s13, cfg.index, s2, 2,
                       ACTIVATION_CODES[activation], float(spec.swiglu_alpha),
                       float(spec.swiglu_limit), (s13 + s2) % 3, fusion)
                err = rel_err(out, ref)
                idle = ~(local >= 0).any(dim=1)
                if not torch.isfinite(out).all() or err > REL_TOL or not (out[idle] == 0).all():
                    failures.append(f"m={m} {cfg.describe()} splits {s13}/{s2} fusion "
                                    f"{configs.FUSIONS[fusion]}: rel err {err:.3g}")
    assert not failures, failures


@pytest.mark.parametrize("block_m", configs.BLOCK_M_CHOICES)
def test_route_groups_routes_by_expert(block_m):
    spec = SPECS["bf16-swiglu-g128-ep-bias"]
    op = kernel_for(spec).loaded_ops()
    expert_map = random_expert_map(spec, seed=1, device=DEVICE)
    _, ids = random_routing(spec, 77, "concentrated", seed=2, device=DEVICE)
    sorted_routes, block_expert, num_blocks, route_expert = op.route(ids, expert_map, spec.num_experts,
                                                                     block_m)
    n = int(num_blocks)
    routes = ids.numel()
    flat = ids.view(-1).long().cpu()
    sorted_routes, block_expert = sorted_routes.cpu(), block_expert.cpu()
    emap = expert_map.cpu()
    assert n <= configs.max_blocks(spec, 77, block_m)
    seen = sorted_routes[: n * block_m]
    real = seen[seen < routes]
    assert sorted(real.tolist()) == list(range(routes))  # every route exactly once
    assert (seen[seen >= routes] == routes).all()  # padding holds the sentinel
    for b in range(n):
        members = seen[b * block_m:(b + 1) * block_m]
        members = members[members < routes]
        assert members.numel() > 0
        assert (emap[flat[members]] == block_expert[b]).all()
    assert torch.equal(route_expert.cpu(), emap[flat])


def test_cuda_graph_replay_matches_eager():
    spec = SPECS["bf16-swiglu-g128-ep-bias"]
    kernel = kernel_for(spec)
    w = weights_for(spec, 9)
    prepared = kernel.prepare_weights(w)
    x = random_tokens(spec, 16, seed=1, device=DEVICE)
    tw, ti = random_routing(spec, 16, seed=2, device=DEVICE)
    eager = kernel(x, tw, ti, prepared)
    out = torch.empty_like(x)
    graph = capture_graph([lambda: kernel(x, tw, ti, prepared, out=out, check=False)])
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, eager) <= 1e-6  # split-K atomics may reorder fp32 sums


def test_plan_fits_this_gpu():
    spec = SPECS["bf16-silu-g128"]
    kernel = kernel_for(spec)
    table = kernel.kernel_attributes()
    gpu = cuda_target().gpu
    for tokens in (1, 64, 2304):
        plan = kernel.plan(tokens)
        assert "block_m" in plan.describe()
        for choice in (plan.gemm13, plan.gemm2):
            a = table[choice.config.index]
            assert a.static_smem + a.dynamic_smem <= gpu.smem_per_block_optin
            # ptxas spills a few words in one or two configs on some archs (48 B at most on sm_80
            # with nvcc 13.0, none on sm_90); a chosen config spilling more is a regression
            assert a.local_bytes <= 64, f"{choice.config.describe()} spills {a.local_bytes} B"


def test_expert_map_with_holes_needs_an_ep_spec():
    spec = SPECS["bf16-silu-g128"]
    w = weights_for(spec, 1)
    holes = torch.tensor([0, 1, 2, -1, 4, 5, 6, 7], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="expert_map"):
        kernel_for(spec).prepare_weights(attrs.evolve(w, expert_map=holes))


def test_memcheck_ep_bias_case():
    """compute-sanitizer memcheck over a small EP + bias layer: no out-of-bounds access."""
    tool = os.environ.get("COMPUTE_SANITIZER") or "compute-sanitizer"
    from shutil import which

    if which(tool) is None:
        pytest.skip("compute-sanitizer not on PATH")
    case = Path(__file__).with_name("memcheck_case.py")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(case)],
                         capture_output=True, text=True, timeout=540, env=env)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    assert "ERROR SUMMARY: 0 errors" in run.stdout + run.stderr, tail

