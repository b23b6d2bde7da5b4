"""triton_moe side by side with vLLM 0.33.0's Triton fused MoE, in one process, on the same weights
and routing: CUDA graphs of one call per rotated input set for each side, samples interleaved
(ours, peer, peer GEMMs, ours, ...), medians, ceilings measured in the same run.

    python benchmarks/triton_moe_peer.py [--peer DIR] [--cases qwen3-30b-a3b:bf16,...]
        [--tokens 1,8,64,512,4096] [--budget-s S] [--json FILE] [--fp8-act [w8a8|w8a8x2]]
        [--peer-tables h200|this-gpu]
    TRITON_INTERPRET=1 python benchmarks/triton_moe_peer.py --device cpu --cases tiny:bf16 --tokens 1,5
        (a check of the harness on CPU: the interpreter's figures mean nothing)

DIR holds vLLM 0.33.0's `fused_moe_kernel` source as `fused_moe_kernel.py` and its tuned
`configs/*NVIDIA_*.json`, as benchmarks/triton_moe_peer_build.py writes them from vLLM's sdist
(the glue around them: benchmarks/peer_fused_moe.py); the peer reads the H200's tables, or with
--peer-tables this-gpu the running GPU's, as vLLM does there. Without --peer only triton_moe is
timed. Columns: `peer` is vLLM's whole layer (its kernel twice plus the glue launches vLLM makes),
`peer GEMMs` its two fused_moe_kernel launches alone (a lower bound on any engine's call),
`alternative` the rule's alternatives where it has some: `gemm` (tensor-core GEMMs, each block's N
tiles in turn) where the rule picks the GEMV path or groups of blocks, `gemv` where it passes the
GEMV path over, `dot_scaled` for mxfp4 (the checkpoint layout through Triton's dot_scaled, and the
GEMV where its rule takes it, on weights prepared for it); with --fp8-act (fp8 layers as w8a8),
`w8a16` and the w8a8 GEMMs in the other operand order (`swap-AB` / `no swap-AB`), or `w8a8 GEMMs`
where the rule keeps the w8a16 GEMV; where fp8 runs as w8a8x2 (two e4m3 terms per activation:
by the rule, or with --fp8-act w8a8x2), `w8a16` and `w8a8` (one term); ratios are peer time / ours
(above 1: triton_moe is faster).
roof: the floor time (the touched experts' bytes at the copy rate, or the FLOPs at the matmul rate
of the format: fp8 dots at torch._scaled_mm's rate, the rest at bf16's) over the median.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import attrs
import torch
from device_weights import device_weights  # benchmarks/ is on sys.path when run as a script
from hal.backends.triton_moe import configs
from hal.backends.triton_moe.kernel import TritonMoEKernel

import hal
from hal import presets
from hal.backend import Target
from hal.bench import ceilings as ceiling_probe
from hal.bench.interleaved import time_sides
from hal.bench.ratios import geomean
from hal.testing.accuracy import rel_err

# A layer small enough for Triton's CPU interpreter.
TINY = dict(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128)
# name -> (preset, our format, the peer's format, spec overrides). gpt-oss-120b:mxfp4 times the
# peer on bf16 weights of the same layer (vLLM's Triton kernel has no mxfp4 path).
CASES = {
    "qwen3-30b-a3b:bf16": ("qwen3-30b-a3b", "bf16", "bf16", {}),
    "qwen3-30b-a3b:fp8": ("qwen3-30b-a3b", "fp8_block128", "fp8_block128", {}),
    "deepseek-v3-ep8:fp8": ("deepseek-v3", "fp8_block128", "fp8_block128", {"num_local_experts": 32}),
    "mixtral-8x7b:bf16": ("mixtral-8x7b", "bf16", "bf16", {}),
    "gpt-oss-120b:bf16": ("gpt-oss-120b", "bf16", "bf16", {}),
    "gpt-oss-120b:mxfp4": ("gpt-oss-120b", "mxfp4", "bf16", {}),
    "qwen3-235b-a22b:bf16": ("qwen3-235b-a22b", "bf16", "bf16", {}),
    "qwen3-235b-a22b:fp8": ("qwen3-235b-a22b", "fp8_block128", "fp8_block128", {}),
    "kimi-k2-ep8:fp8": ("kimi-k2", "fp8_block128", "fp8_block128", {"num_local_experts": 48}),
    "tiny:bf16": ("qwen3-30b-a3b", "bf16", "bf16", TINY),
    "tiny-ep:fp8": ("qwen3-30b-a3b", "fp8_block128", "fp8_block128", dict(TINY, num_local_experts=6)),
    "tiny:mxfp4": ("gpt-oss-120b", "mxfp4", "bf16", TINY),
}
DEFAULT_CASES = ("qwen3-30b-a3b:bf16", "qwen3-30b-a3b:fp8", "deepseek-v3-ep8:fp8", "mixtral-8x7b:bf16",
                 "gpt-oss-120b:bf16", "gpt-oss-120b:mxfp4")
DEFAULT_TOKENS = (1, 8, 64, 512, 4096)
ROTATE = 8  # input sets per graph: consecutive calls route to different experts
MIN_SAMPLE_S = 0.004  # each sample replays a graph at least this long
FP8_MATMUL_N = 8192
FP8_ACT = {"w8a8": True, "w8a8x2": "x2"}  # --fp8-act -> TritonMoEKernel(fp8_act=...)


def input_sets(spec, tokens: int, device, expert_map) -> tuple:
    """ROTATE sets of (x, topk_weights, topk_ids) with uniform routing, and the mean number of local
    experts and local routes a set touches."""
    g = torch.Generator(device=device).manual_seed(1000 + tokens)
    sets, touched, routes = [], [], []
    for _ in range(ROTATE):
        x = torch.randn(tokens, spec.hidden_size, generator=g, device=device).to(torch.bfloat16)
        ids = torch.rand(tokens, spec.num_experts, generator=g, device=device).topk(spec.top_k, dim=1).indices
        tw = torch.softmax(torch.randn(tokens, spec.top_k, generator=g, device=device), dim=-1)
        local = ids if expert_map is None else expert_map.long()[ids]
        local = local[local >= 0]
        touched.append(local.unique().numel())
        routes.append(local.numel())
        sets.append((x, tw, ids.to(torch.int32)))
    return sets, sum(touched) / ROTATE, sum(routes) / ROTATE


def fp8_matmul_tflops(device, bf16_tflops: float) -> float:
    """torch._scaled_mm's e4m3 rate at FP8_MATMUL_N^3 (bf16 out, per-tensor scales); on CPU the
    bf16 rate."""
    if device == "cpu":
        return bf16_tflops
    n = FP8_MATMUL_N
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    call = (lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    seconds = time_sides({"mm": [call]}, 10, device, MIN_SAMPLE_S)["mm"]
    return 2 * n**3 / seconds / 1e12


@attrs.frozen
class Row:
    case: str
    tokens: int
    ours_us: float | None
    ours_roof: float | None
    peer_us: float | None
    peer_roof: float | None
    peer_gemms_us: float | None
    ratio: float | None  # peer / ours
    ratio_gemms: float | None  # peer GEMMs alone / ours
    alternatives_us: dict  # the rule's alternatives where there are some: name -> us
    diff: float | None  # ||ours - peer|| / ||peer|| on the first input set
    plan: str
    peer_config: str


def run_case(name: str, tokens_list, peer_dir, target, ceil, fp8_rate, iters, deadline, log, fp8_act,
             peer_tables: str):
    """peer_tables: the device_name of the peer's tuned configs (vLLM's naming, e.g. NVIDIA_H200)."""
    device = target.device
    from peer_fused_moe import PeerFusedMoE  # benchmarks/ is on sys.path when run as a script

    preset, ours_fmt, peer_fmt, overrides = CASES[name]
    spec = presets.get(preset).spec(ours_fmt, **overrides)
    weights = device_weights(spec, 7, device)
    w8a8 = fp8_act is not None and ours_fmt == "fp8_block128"
    kernel = TritonMoEKernel(spec, target, fp8_act=fp8_act) if w8a8 else TritonMoEKernel(spec, target)
    prepared = kernel.prepare_weights(weights)
    # The rule's alternatives (the weights are prepared the same way for every variant but mxfp4's
    # checkpoint-layout path, which gets its own).
    grouped = {"gemm": TritonMoEKernel(spec, target, gemv=False, swap_ab=False, grouped_n=False),
               "gemv": TritonMoEKernel(spec, target, gemv=True)}
    own_prepared = {}
    if ours_fmt == "mxfp4":
        grouped = {"dot_scaled": TritonMoEKernel(spec, target, mxfp4_path="dot_scaled")}
        own_prepared["dot_scaled"] = grouped["dot_scaled"].prepare_weights(weights)
    if ours_fmt == "fp8_block128":  # the other numerics of fp8 weights, where the rule takes w8a8x2
        grouped.update(w8a16=TritonMoEKernel(spec, target, fp8_act=False),
                       w8a8=TritonMoEKernel(spec, target, fp8_act=True))
    if w8a8:
        grouped.update({"w8a8 GEMMs": TritonMoEKernel(spec, target, fp8_act=fp8_act, gemv=False),
                        "swap-AB": TritonMoEKernel(spec, target, fp8_act=fp8_act, swap_ab=True),
                        "no swap-AB": TritonMoEKernel(spec, target, fp8_act=fp8_act, swap_ab=False)})
    peer = None
    peer_spec = presets.get(preset).spec(peer_fmt, **overrides)
    if peer_dir is not None:
        peer_weights = weights if peer_fmt == ours_fmt else device_weights(peer_spec, 7, device)
        peer = PeerFusedMoE.load(peer_dir, peer_spec, peer_weights, peer_tables)
        print(f"# {name}: peer configs from {peer.config_source()}", file=log, flush=True)
    rows = []
    for tokens in tokens_list:
        if time.monotonic() > deadline:
            print(f"# {name} T={tokens}: skipped (time budget spent)", file=log, flush=True)
            continue
        try:
            row = run_point(name, tokens, spec, weights, kernel, prepared, grouped, own_prepared, peer,
                            peer_spec, ours_fmt == peer_fmt, ceil, fp8_rate, iters, device, log)
            if row is None:
                continue
            rows.append(row)
        except Exception as exc:  # one failing point is reported; the others still run
            print(f"# {name} T={tokens}: failed: {type(exc).__name__}: {str(exc)[:400]}", file=log,
                  flush=True)
            continue
        print(format_row(rows[-1]), file=log, flush=True)
    del prepared, own_prepared, weights, peer
    if device != "cpu":
        torch.cuda.empty_cache()
    return rows


def run_point(name, tokens, spec, weights, kernel, prepared, alternatives, own_prepared, peer, peer_spec,
              same_weights, ceil, fp8_rate, iters, device, log) -> Row:
    sets, touched, routes = input_sets(spec, tokens, device, weights.expert_map)
    outs = {side: [torch.empty_like(x) for x, _, _ in sets] for side in ("ours", "peer", *alternatives)}

    def calls_of(k, p, side):
        return [(lambda s=s, o=o: k(s[0], s[1], s[2], p, out=o, check=False))
                for s, o in zip(sets, outs[side], strict=True)]

    sides = {"ours": calls_of(kernel, prepared, "ours")}
    chosen = kernel.plan(tokens).config
    alts = []
    if chosen.fp8_act and chosen.act_terms == 2:
        alts = ["w8a16", "w8a8"]  # the other numerics of fp8 weights
    elif chosen.fp8_act:
        # w8a16's numerics, and the other operand order of the w8a8 GEMMs.
        alts = ["w8a16", "no swap-AB" if chosen.gemm1.swap_ab else "swap-AB"]
    elif kernel.fp8_act and spec.weight_format == "fp8_block128":
        alts = ["w8a8 GEMMs"]  # w8a8 asked for, the rule keeps the w8a16 GEMV
    elif spec.weight_format == "mxfp4":
        alts = ["dot_scaled"]  # the checkpoint layout through Triton's dot_scaled (and its GEMV)
    elif chosen.gemv1 is not None or any(g.group_m > 1 for g in (chosen.gemm1, chosen.gemm2)):
        alts = ["gemm"]  # the tensor-core GEMMs, each block's N tiles in turn
    elif configs.uses_gemv(spec, chosen.tokens_bucket, False, 0, forced=True):
        alts = ["gemv"]  # the GEMV path the rule passes over for this format
    for alt in alts:
        sides[alt] = calls_of(alternatives[alt], own_prepared.get(alt, prepared), alt)
    peer_config = ""
    if peer is not None:
        calls = [peer.call(x, tw, ti, o) for (x, tw, ti), o in zip(sets, outs["peer"], strict=True)]
        sides["peer"] = [c.run for c in calls]
        sides["peer_gemms"] = [c.run_gemms for c in calls]
        peer_config = json.dumps(calls[0].config, sort_keys=True) + (" naive" if calls[0].naive else "")
    for side in list(sides):  # a side that fails to compile or run is reported; the others are timed
        try:
            for call in sides[side]:
                call()
            if device != "cpu":
                torch.cuda.synchronize()
        except Exception as exc:
            print(f"# {name} T={tokens} {side}: failed: {type(exc).__name__}: {str(exc)[:300]}", file=log,
                  flush=True)
            del sides[side]
    if "peer_gemms" in sides and "peer" not in sides:
        del sides["peer_gemms"]
    if ceil is None:  # --warm-only: compiled and run once, nothing timed
        return None
    diff = (rel_err(outs["ours"][0], outs["peer"][0]) if same_weights and "peer" in sides and "ours" in sides
            else None)
    times = time_sides(sides, iters, device, MIN_SAMPLE_S)
    flops = routes * spec.flops_per_token()

    def roof(fmt_spec, seconds, touched=touched, flops=flops):
        rate = fp8_rate if fmt_spec.weight_format == "fp8_block128" else ceil.bf16_tflops
        floor = max(touched * fmt_spec.weight_bytes_per_expert() / (ceil.copy_gbps * 1e9),
                    flops / (rate * 1e12))
        return floor / seconds

    ours = times.get("ours")
    peer_t, gemms_t = times.get("peer"), times.get("peer_gemms")
    us = (lambda t: None if t is None else t * 1e6)  # noqa: E731
    ratio = (lambda a, b: None if a is None or b is None else a / b)  # noqa: E731
    return Row(name, tokens, us(ours), None if ours is None else roof(spec, ours), us(peer_t),
               None if peer_t is None else roof(peer_spec, peer_t), us(gemms_t), ratio(peer_t, ours),
               ratio(gemms_t, ours), {alt: us(times[alt]) for alt in alts if alt in times}, diff,
               chosen.describe(), peer_config)


def _opt(v, fmt):
    return "-" if v is None else format(v, fmt)


HEADER = ("| case | T | triton_moe us | roof | peer us | roof | peer GEMMs us | peer/ours | "
          "GEMMs/ours | diff | alternative us |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def format_row(r: Row) -> str:
    return (f"| {r.case} | {r.tokens} | {_opt(r.ours_us, '.1f')} | {_opt(r.ours_roof, '.0%')} | "
            f"{_opt(r.peer_us, '.1f')} | "
            f"{_opt(r.peer_roof, '.0%')} | {_opt(r.peer_gemms_us, '.1f')} | {_opt(r.ratio, '.2f')} | "
            f"{_opt(r.ratio_gemms, '.2f')} | {_opt(r.diff, '.1e')} | "
            + (", ".join(f"{us:.1f} ({alt})" for alt, us in r.alternatives_us.items()) or "-") + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default=None, help="folder with vLLM's fused_moe_kernel.py and configs/")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="from: " + ", ".join(CASES))
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    parser.add_argument("--iters", type=int, default=9)
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="start no new point after this many seconds")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--peer-tables", choices=("h200", "this-gpu"), default="h200",
                        help="the peer's tuned configs: the H200's (the default), or this GPU's as "
                             "vLLM names it, as vLLM itself runs on it (its default rule where none)")
    parser.add_argument("--fp8-act", nargs="?", const="w8a8", choices=FP8_ACT,
                        help="run fp8_block128 as w8a8 (fp8_act=True; w8a16 and the other operand "
                             "order timed beside it) or w8a8x2 (fp8_act='x2'; w8a16 and w8a8 beside it)")
    parser.add_argument("--warm-only", action="store_true",
                        help="compile and run every side once, time nothing (fills Triton's cache, so "
                             "several processes can compile the cases in parallel before a timed run)")
    args = parser.parse_args(argv)
    fp8_act = FP8_ACT.get(args.fp8_act)
    cases = args.cases.split(",")
    for case in cases:
        if case not in CASES:
            raise ValueError(f"--cases: {case!r} is not one of " + ", ".join(CASES))
    tokens = [int(t) for t in args.tokens.split(",")]
    deadline = time.monotonic() + args.budget_s
    device = args.device
    if device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA GPU here")
    import triton

    target = Target(device, hal.probe(deep=device != "cpu"))
    from peer_fused_moe import H200_TABLES, vllm_device_name

    if args.peer_tables == "this-gpu" and device == "cpu":
        raise ValueError("--peer-tables this-gpu: --device cpu has no GPU whose tables to take")
    peer_tables = vllm_device_name(device) if args.peer_tables == "this-gpu" else H200_TABLES
    if args.warm_only:
        for case in cases:
            run_case(case, tokens, args.peer, target, None, None, 1, deadline, sys.stdout, fp8_act,
                     peer_tables)
        return 0
    ceil = ceiling_probe.measure("cpu" if device == "cpu" else "cuda")
    fp8_rate = fp8_matmul_tflops(device, ceil.bf16_tflops)
    name = "cpu" if device == "cpu" else torch.cuda.get_device_name()
    print(f"# {name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"CUDA {torch.version.cuda}; {ceil.describe()}, fp8 matmul {fp8_rate:.0f} TFLOP/s; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    print(HEADER, flush=True)
    rows = []
    for case in cases:
        if time.monotonic() > deadline:
            print(f"# {case}: skipped (time budget spent)", flush=True)
            continue
        try:
            rows += run_case(case, tokens, args.peer, target, ceil, fp8_rate, args.iters, deadline,
                             sys.stdout, fp8_act, peer_tables)
        except Exception as exc:  # one failing case is reported; the others still run
            print(f"# {case}: failed: {type(exc).__name__}: {exc}", flush=True)
    if args.peer:
        for fmt in ("bf16", "fp8"):
            picked = [r for r in rows if r.case.endswith(":" + fmt)]
            print(f"# geomean peer/ours {fmt}: {geomean([r.ratio for r in picked]):.2f} "
                  f"(peer GEMMs alone: {geomean([r.ratio_gemms for r in picked]):.2f}) "
                  f"over {len(picked)} points")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=name, torch=torch.__version__,
                           triton=triton.__version__, cuda=torch.version.cuda, ceilings=attrs.asdict(ceil),
                           fp8_tflops=fp8_rate, rows=[attrs.asdict(r) for r in rows]), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
