"""Benchmark of the W4AFP8 MoE on the DeepEP masked layout, DeepSeek-V3 expert-parallel shapes
(H 7168, I 2048; 8-32 local experts; 1-8 decode and 64-512 prefill rows per expert).

Times, on the same inputs:
    w4afp8:requant   the w4afp8 backend as selected: the requant op writes per-tensor FP8, then the
                     GEMMs run with the measured tile rule (weights on the MMA's M side)
    w4afp8:fused     the same GEMMs fed the per-token-group FP8 directly (--no-fused skips it)
    w4afp8:per_group the tile rule without folding the weight scales: each K group's MMA result
                     scaled by its weight scale (--no-per-group skips it)
    w4afp8:rows_on_m the previous tiles: rows on the FP8 MMA's M side (--no-rows-on-m skips it)
    tile:PATH:...    with --tile PATH:BLOCK_M:BLOCK_N:WARPS:STAGES (repeatable): the requant feed
                     with that transposed tile at every row count (a tile sweep)
    requant          the requant backend's masked MoE (Triton requant, GEMMs on hal.backends.reference)
    reference        hal.backends.reference (--no-reference skips it)
    marlin           with --marlin: the marlin backend's W4A16 layer (bf16 activations) on the same
                     int4 weights and scales, each local expert routed exactly the same rows (token
                     layout, top-k 1); skipped with its reason where marlin does not build

and reports the median per call, the weight bytes read per second against the copy rate measured in
the same run (the roofline of a weight-bound decode step), and FP8 TFLOP/s against an FP8 matmul
measured in the same run. Timing replays a CUDA graph over rotated input sets and two copies of
the prepared weights, so no call finds the previous call's weights or activations in L2.

    python benchmarks/w4afp8_masked.py [--experts 8 16 32] [--rows 1 2 4 8 64 128 256 512] [--marlin]
                                       [--no-fused] [--no-per-group] [--no-rows-on-m] [--no-fallback]
                                       [--tile folded:128:64:4:3 ...] [--json]"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

HIDDEN, INTERMEDIATE, GLOBAL_EXPERTS, TOP_K = 7168, 2048, 256, 8
DEFAULT_EXPERTS = (8, 16, 32)
DEFAULT_ROWS = (1, 2, 4, 8, 64, 128, 256, 512)
# activation sets cycled through (8 x 32 experts x 512 rows x 7168 B = 940 MB at the largest
# shape) and prepared-weight copies (2 x 32 experts x 22 MB): several times the H200's L2.
ROTATE_INPUTS = 8
ROTATE_WEIGHTS = 2
# DeepEP's low-latency buffer holds more rows per expert than a decode step fills.
MIN_MAX_M = 128
FP8_MATMUL_N = 8192


def gpu_or_reason() -> Optional[str]:
    try:
        import torch
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return f"no GPU visible to torch {torch.__version__}"
    return None


def fp8_tflops(fp8_dtype) -> Optional[float]:
    """An FP8 matmul's rate here (torch._scaled_mm, bf16 out), or None where torch has none."""
    import torch

    from hal.bench.timing import time_calls

    try:
        a = torch.randn(FP8_MATMUL_N, FP8_MATMUL_N, device="cuda").to(fp8_dtype)
        b = torch.randn(FP8_MATMUL_N, FP8_MATMUL_N, device="cuda").to(fp8_dtype).t()  # column-major
        one = torch.ones((), device="cuda")
        call = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        call()
    except (RuntimeError, AttributeError, TypeError) as exc:
        print(f"[w4afp8 bench] no FP8 matmul ceiling: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return 2 * FP8_MATMUL_N**3 / time_calls("cuda", [call], warmup=2, iters=10).median_s / 1e12


def parse_tile(text: str):
    """PATH:BLOCK_M:BLOCK_N:WARPS:STAGES -> a transposed configs.GemmTile."""
    from hal.backends.w4afp8 import configs

    path, *numbers = text.split(":")
    if path not in configs.PATHS or path == "fp8" or len(numbers) != 4:
        raise argparse.ArgumentTypeError(f"--tile {text!r}: expected PATH:BLOCK_M:BLOCK_N:WARPS:STAGES "
                                         f"with PATH one of the transposed paths")
    block_m, block_n, warps, stages = map(int, numbers)
    return configs.GemmTile(block_m, block_n, warps, stages, path)


def kernels(spec, device, caps, include: set, tiles=()):
    """[(label, kernel)]: the w4afp8 default (requant feed, transposed tiles), its baselines (the
    fused feed, the per-group tiles, the previous rows-on-M tiles) and the backends it replaces,
    those named in `include`, then one kernel per forced tile."""
    import hal

    default = hal.select_moe_kernel(spec, device, caps=caps, prefer="w4afp8")
    out = [(f"w4afp8:{default.variant}", default)]
    out += [(f"w4afp8:{name}", k) for name, k in default.baselines().items() if name in include]
    out += [(f"tile:{t.path}:{t.block_m}:{t.block_n}:{t.num_warps}:{t.num_stages}",
             type(default)(spec, default.target, tile=t)) for t in tiles]
    for name in ("requant", "reference"):
        if name in include:
            out.append((name, hal.select_moe_kernel(spec, device, caps=caps, prefer=name)))
    return out


def marlin_kernel(experts: int, device, caps):
    """The marlin W4A16 layer over `experts` experts (token layout, top-k 1), or None with the reason
    printed where it does not build here."""
    import hal
    from hal.spec import MoESpec

    spec = MoESpec(num_experts=experts, top_k=1, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                   weight_format="int4_g128")
    try:
        return hal.select_moe_kernel(spec, device, caps=caps, prefer="marlin")
    except Exception as exc:  # a missing toolchain or a failed build: the comparison is skipped
        print(f"[w4afp8 bench] no marlin comparison: {type(exc).__name__}: {str(exc)[:500]}",
              file=sys.stderr, flush=True)
        return None


def marlin_calls(kernel, weight_sets, experts: int, rows: int, device):
    """Calls of the marlin layer on the same int4 weights and scales, each expert routed exactly
    `rows` tokens of bf16 activations, rotated over ROTATE_INPUTS token sets."""
    import torch

    from hal.spec import MoEWeights

    prepared = [kernel.prepare_weights(MoEWeights(w13=w.w13, w2=w.w2, w13_scale=w.w13_scale,
                                                  w2_scale=w.w2_scale)) for w in weight_sets]
    tokens = experts * rows
    ids = torch.arange(experts, device=device, dtype=torch.int32).repeat_interleave(rows).view(-1, 1)
    weights = torch.ones(tokens, 1, device=device, dtype=torch.float32)
    g = torch.Generator(device=device).manual_seed(7)
    xs = [torch.randn(tokens, HIDDEN, generator=g, device=device).to(torch.bfloat16)
          for _ in range(ROTATE_INPUTS)]
    outs = [torch.empty_like(x) for x in xs]
    return [(lambda x=x, o=o, p=prepared[i % ROTATE_WEIGHTS]: kernel(x, weights, ids, p, out=o, check=False))
            for i, (x, o) in enumerate(zip(xs, outs, strict=True))]


def bench_experts(experts: int, rows_list, device: str, caps, ceilings, fp8_rate, include: set, tiles=()):
    import attrs
    import torch

    from hal.bench.timing import time_calls
    from hal.spec import MoESpec
    from hal.synth import random_expert_map, random_masked_inputs, random_weights

    spec = MoESpec(num_experts=GLOBAL_EXPERTS, top_k=TOP_K, hidden_size=HIDDEN,
                   intermediate_size=INTERMEDIATE, num_local_experts=experts, weight_format="w4afp8",
                   layout="masked")
    runs = kernels(spec, device, caps, include, tiles)
    fp8 = runs[0][1].fp8_dtype
    marlin = marlin_kernel(experts, device, caps) if "marlin" in include else None
    # The masked layout holds local experts only; the expert map is validated, never read.
    expert_map = random_expert_map(spec, seed=99, device=device)
    weight_sets = [attrs.evolve(random_weights(spec, device=device, seed=100 + i), expert_map=expert_map)
                   for i in range(ROTATE_WEIGHTS)]
    prepared = {}
    for label, kernel in runs:
        print(f"[w4afp8 bench] E={experts}: preparing weights for {label} ...", file=sys.stderr, flush=True)
        # Both feeds of the w4afp8 backend take the same prepared weights.
        same = next((other for other, k in runs if other in prepared and k.backend == kernel.backend), None)
        prepared[label] = prepared[same] if same else [kernel.prepare_weights(w) for w in weight_sets]
    results = []
    for rows in rows_list:
        max_m = max(MIN_MAX_M, rows)
        sets = [random_masked_inputs(experts, HIDDEN, max_m, [rows] * experts, seed=1000 + i,
                                     device=device, fp8_dtype=fp8) for i in range(ROTATE_INPUTS)]
        outs = [torch.empty(s[0].shape, dtype=torch.bfloat16, device=device) for s in sets]
        weight_bytes = experts * spec.weight_bytes_per_expert()
        flops = experts * rows * spec.flops_per_token()
        timed = [(label, [(lambda k=kernel, s=s, o=o, p=prepared[label][i % ROTATE_WEIGHTS], n=rows:
                           k(s[0], s[1], s[2], p, expected_rows=n, out=o, check=False))
                          for i, (s, o) in enumerate(zip(sets, outs, strict=True))])
                 for label, kernel in runs]
        if marlin is not None:
            timed.append(("marlin", marlin_calls(marlin, weight_sets, experts, rows, device)))
        for label, calls in timed:
            timing = time_calls(device, calls)
            seconds = timing.median_s
            results.append(dict(
                experts=experts, rows_per_expert=rows, max_m=max_m, variant=label,
                median_us=seconds * 1e6, p10_us=timing.p10_s * 1e6, p90_us=timing.p90_s * 1e6,
                method=timing.method, weight_gbps=weight_bytes / seconds / 1e9,
                weight_roofline=weight_bytes / (ceilings.copy_gbps * 1e9) / seconds,
                fp8_tflops=flops / seconds / 1e12,
                fp8_peak_fraction=None if fp8_rate is None else flops / seconds / 1e12 / fp8_rate))
            print(f"[w4afp8 bench] E={experts:<3} rows={rows:<4} {label:<16} {seconds * 1e6:10.1f} us "
                  f"({timing.method})", file=sys.stderr, flush=True)
        del sets, outs, timed
    del prepared
    torch.cuda.empty_cache()
    return results


def table(results) -> str:
    head = (f"{'E':>3} {'rows':>5} {'variant':<16} {'median us':>10} {'weight GB/s':>12} "
            f"{'roofline':>9} {'FP8 TFLOP/s':>12} {'vs requant feed':>16} {'vs requant':>11} "
            f"{'vs per_group':>12} {'vs rows_on_m':>12} {'vs marlin':>10}")
    lines = [head, "-" * len(head)]
    by_key = {(r["experts"], r["rows_per_expert"], r["variant"]): r for r in results}
    for r in results:
        key = (r["experts"], r["rows_per_expert"])
        feed = by_key.get((*key, "w4afp8:requant"))
        fallback = by_key.get((*key, "requant"))
        marlin = by_key.get((*key, "marlin"))
        previous = by_key.get((*key, "w4afp8:rows_on_m"))
        per_group = by_key.get((*key, "w4afp8:per_group"))
        ratio = lambda other, r=r: f"{other['median_us'] / r['median_us']:.2f}x" if other else "-"
        lines.append(f"{r['experts']:>3} {r['rows_per_expert']:>5} {r['variant']:<16} "
                     f"{r['median_us']:>10.1f} {r['weight_gbps']:>12.0f} {r['weight_roofline']:>9.1%} "
                     f"{r['fp8_tflops']:>12.1f} {ratio(feed):>16} {ratio(fallback):>11} "
                     f"{ratio(per_group):>12} {ratio(previous):>12} {ratio(marlin):>10}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, nargs="+", default=list(DEFAULT_EXPERTS))
    parser.add_argument("--rows", type=int, nargs="+", default=list(DEFAULT_ROWS),
                        help="rows per local expert")
    parser.add_argument("--no-reference", action="store_true", help="skip hal.backends.reference")
    parser.add_argument("--no-fallback", action="store_true", help="skip the requant backend's layer")
    parser.add_argument("--no-fused", action="store_true", help="skip the w4afp8 fused feed")
    parser.add_argument("--no-per-group", action="store_true",
                        help="skip the w4afp8 per-group tiles (the weight scales not folded)")
    parser.add_argument("--tile", type=parse_tile, action="append", default=[],
                        help="also time the requant feed with this transposed tile, "
                             "PATH:BLOCK_M:BLOCK_N:WARPS:STAGES (repeatable)")
    parser.add_argument("--no-rows-on-m", action="store_true",
                        help="skip the w4afp8 previous tiles (rows on the FP8 MMA's M side)")
    parser.add_argument("--marlin", action="store_true",
                        help="also time the marlin W4A16 layer on the same weights")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    reason = gpu_or_reason()
    if reason:
        print(f"w4afp8_masked: nothing measured: {reason}; this benchmark needs a GPU with FP8 MMA")
        return 0
    import torch

    import hal
    from hal.bench.ceilings import measure

    device = f"cuda:{torch.cuda.current_device()}"
    caps = hal.probe(deep=True)
    ceilings = measure(device)
    print(f"[w4afp8 bench] {ceilings.describe()}", file=sys.stderr, flush=True)
    probe_spec = hal.MoESpec(num_experts=GLOBAL_EXPERTS, top_k=TOP_K, hidden_size=HIDDEN,
                             intermediate_size=INTERMEDIATE, num_local_experts=DEFAULT_EXPERTS[0],
                             weight_format="w4afp8", layout="masked")
    fp8 = hal.select_moe_kernel(probe_spec, device, caps=caps, prefer="w4afp8").fp8_dtype
    fp8_rate = fp8_tflops(fp8)
    results = []
    include = {name for name, skip in (("reference", args.no_reference), ("requant", args.no_fallback),
                                       ("fused", args.no_fused), ("per_group", args.no_per_group),
                                       ("rows_on_m", args.no_rows_on_m),
                                       ("marlin", not args.marlin)) if not skip}
    for experts in args.experts:
        results += bench_experts(experts, args.rows, device, caps, ceilings, fp8_rate, include, args.tile)
    gpu = torch.cuda.get_device_name()
    header = (f"w4afp8 masked MoE, H {HIDDEN}, I {INTERMEDIATE}, on {gpu}: {ceilings.describe()}; "
              f"FP8 matmul {'n/a' if fp8_rate is None else f'{fp8_rate:.0f} TFLOP/s'}")
    if args.json:
        print(json.dumps(dict(device=gpu, copy_gbps=ceilings.copy_gbps, fp8_tflops=fp8_rate,
                              launch_us=ceilings.launch_us, results=results), indent=1))
    else:
        print(header)
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
