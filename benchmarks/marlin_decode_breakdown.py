"""Where a Marlin MoE layer's decode time goes, on a GPU: the whole layer, the routing alone, and
each GEMM alone with the planner's config, then every compiled config and K split for each GEMM
(the fastest one and its time). Same weights, rotated inputs and CUDA-graph timing as `hal bench`.

    python benchmarks/marlin_decode_breakdown.py [--models mixtral-8x7b,deepseek-v3] [--tokens 1,8,32]

GB/s counts each GEMM's checkpoint bytes (int4 + scales) of the local experts the inputs touch."""

from __future__ import annotations

import argparse
import json

import torch
from hal.backends.marlin import configs

from hal.bench.moe import DEFAULT_ROTATE, bench_weights, input_sets
from hal.bench.timing import time_calls
from hal.presets import PRESETS
from hal.registry import select_moe_kernel

LOCAL_EXPERTS = {"deepseek-v3": 32}  # one rank of 8-way expert parallelism, as `hal bench suite marlin`
SPLITS = (1, 2, 4, 8, 16)


def gemm_bytes(spec, touched: float) -> tuple:
    """(GEMM 1, GEMM 2) checkpoint bytes: int4 weights plus one 16-bit scale per 128 along K."""
    h, i, r = spec.hidden_size, spec.intermediate_size, spec.w13_rows
    return touched * (r * h / 2 + r * h / 128 * 2), touched * (h * i / 2 + h * i / 128 * 2)


def breakdown(model: str, tokens: int, iters: int) -> dict:
    kw = {"num_local_experts": LOCAL_EXPERTS[model]} if model in LOCAL_EXPERTS else {}
    spec = PRESETS[model].spec("int4_g128", **kw)
    kernel = select_moe_kernel(spec, "cuda", prefer="marlin")
    weights, emap = bench_weights(spec, "cuda")
    prepared = kernel.prepare_weights(weights)
    data = prepared.data
    ops = kernel.loaded_ops()
    plan = kernel.plan(tokens)
    bm, top_k = plan.block_m, spec.top_k
    routes = tokens * top_k
    token_sets, touched, _ = input_sets(spec, tokens, "uniform", DEFAULT_ROTATE, "cuda", emap)
    sets = []
    for x, tw, ti in token_sets:
        sorted_routes, block_expert, num_blocks, _ = ops.route(ti, emap, spec.num_experts, bm)
        a2 = torch.randn(routes, spec.intermediate_size, device="cuda").to(x.dtype)
        sets.append((x, tw.float().contiguous(), ti, sorted_routes, block_expert, num_blocks, a2))
    b1, b2 = gemm_bytes(spec, touched)
    n1, k1, n2, k2 = spec.w13_rows, spec.hidden_size, spec.hidden_size, spec.intermediate_size

    def timed(calls):
        return time_calls("cuda", calls, 3, iters).median_s * 1e6

    def gemm1(config, splits):
        c1 = [torch.empty(splits, routes, n1, device="cuda") for _ in sets]
        return timed([lambda s=s, c=c: ops.gemm(s[0], top_k, data.w13, data.s13, data.group13, data.b13,
                                                None, s[3], s[4], s[5], c, 1, False, routes,
                                                plan.grid_m, config, splits)
                      for s, c in zip(sets, c1, strict=True)])

    def gemm2(config, splits):
        acc = [torch.empty(tokens, n2, device="cuda") for _ in sets]
        return timed([lambda s=s, c=c: ops.gemm(s[6], 1, data.w2, data.s2, data.group2, data.b2, s[1],
                                                s[3], s[4], s[5], c, top_k, True, routes, plan.grid_m,
                                                config, splits)
                      for s, c in zip(sets, acc, strict=True)])

    def sweep(run, n, k):
        best = None
        for cfg in configs.candidates():
            if cfg.block_m != bm or not configs.fits(cfg, n, k):
                continue
            for splits in SPLITS:
                if k % (splits * cfg.thread_k) or k // splits < cfg.thread_k:
                    continue
                us = run(cfg.index, splits)
                if best is None or us < best[0]:
                    best = (us, f"{cfg.describe()} x{splits}")
        return best

    outs = [torch.empty_like(s[0]) for s in sets]
    layer = timed([lambda s=s, o=o: kernel(s[0], s[1], s[2], prepared, out=o, check=False)
                   for s, o in zip(sets, outs, strict=True)])
    route = timed([lambda s=s: ops.route(s[2], emap, spec.num_experts, bm) for s in sets])
    g1 = gemm1(plan.gemm13.config.index, plan.gemm13.splits)
    g2 = gemm2(plan.gemm2.config.index, plan.gemm2.splits)
    best1, best2 = sweep(gemm1, n1, k1), sweep(gemm2, n2, k2)
    return {"model": model, "tokens": tokens, "block_m": bm, "touched_experts": touched,
            "layer_us": layer, "layer_gbps": (b1 + b2) / layer / 1e3, "route_us": route,
            "gemm1": {"config": plan.gemm13.describe(), "us": g1, "gbps": b1 / g1 / 1e3,
                      "best": best1[1], "best_us": best1[0], "best_gbps": b1 / best1[0] / 1e3},
            "gemm2": {"config": plan.gemm2.describe(), "us": g2, "gbps": b2 / g2 / 1e3,
                      "best": best2[1], "best_us": best2[0], "best_gbps": b2 / best2[0] / 1e3},
            "rest_us": layer - route - g1 - g2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mixtral-8x7b,deepseek-v3")
    parser.add_argument("--tokens", default="1,8,32")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    for model in args.models.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            r = breakdown(model, tokens, args.iters)
            print(json.dumps(r), flush=True)
            g1, g2 = r["gemm1"], r["gemm2"]
            print(f"# {model} {tokens} tok: layer {r['layer_us']:.1f} us ({r['layer_gbps']:.0f} GB/s) = "
                  f"route {r['route_us']:.1f} + GEMM1 {g1['us']:.1f} ({g1['gbps']:.0f} GB/s; best "
                  f"{g1['best']} {g1['best_us']:.1f}) + GEMM2 {g2['us']:.1f} ({g2['gbps']:.0f} GB/s; best "
                  f"{g2['best']} {g2['best_us']:.1f}) + rest {r['rest_us']:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
