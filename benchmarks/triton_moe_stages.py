"""Where triton_moe's time goes, and which launch configs beat the rule: each launch
timed alone, then the whole call under alternative configs, on public MoE layers. CUDA graphs of
one call per rotated input set (as `hal bench moe`), medians.

    python benchmarks/triton_moe_stages.py [--points qwen3-30b-a3b:bf16:4096,...,model:fp8_block128:T:w8a8x2]
                                           [--sweep [tiles,deeper,regrouped,shallower,grouped,
                                                     per_route,split_k]]
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Optional

import attrs
import torch
from device_weights import device_weights  # benchmarks/ is on sys.path when run as a script
from hal.backends.triton_moe import configs
from hal.backends.triton_moe.kernel import TritonMoEKernel

import hal
from hal import presets
from hal.backend import Target
from hal.bench.moe import input_sets
from hal.bench.timing import time_calls

DEFAULT_POINTS = ("qwen3-30b-a3b:bf16:1", "qwen3-30b-a3b:bf16:4096", "gpt-oss-120b:mxfp4:1",
                  "gpt-oss-120b:mxfp4:64", "deepseek-v3:fp8_block128:4096:w8a8")
ROTATE = 4
# Alternatives to the rule's config: (BLOCK_M, GEMM1 (BN, BK, warps, stages), GEMM2 (...)).
PREFILL_CANDIDATES = (
    (128, (128, 64, 8, 3), (128, 64, 8, 3)),
    (128, (64, 64, 4, 4), (128, 64, 4, 4)),
    (64, (64, 64, 4, 4), (128, 64, 4, 4)),
    (64, (128, 64, 4, 3), (128, 64, 4, 3)),
    (128, (64, 128, 8, 3), (128, 128, 8, 3)),
)
# w8a8 (fp8 x fp8 dots, BLOCK_K 128: one scale per K step); 5-tuples carry swap-AB.
W8A8_PREFILL_CANDIDATES = (
    (64, (128, 128, 4, 4), (128, 128, 4, 4)),
    (64, (128, 128, 8, 3), (128, 128, 8, 3)),
    (64, (64, 128, 4, 4), (128, 128, 4, 4)),
    (128, (64, 128, 8, 3), (128, 128, 8, 3)),
    (128, (128, 128, 8, 3), (128, 128, 8, 3)),
    (64, (128, 128, 8, 5), (256, 128, 8, 4)),
)
W8A8_DECODE_CANDIDATES = (
    (16, (128, 128, 4, 3, True), (128, 128, 4, 4, True)),
    (16, (128, 128, 4, 5, True), (128, 128, 4, 5, True)),
    (16, (64, 128, 4, 4, True), (64, 128, 4, 4, True)),
    (16, (64, 128, 4, 3, True), (128, 128, 4, 3, True)),
)
# w8a8x2 where the rule's blocks are 64 rows or more (the sweep behind configs.W8A8X2_PREFILL_GEMM1
# and _GEMM2, the fifth candidate): blocks of 32 or 16 rows with the decode tiles (swap-AB: the
# weights in wgmma's M), reading a busy expert's weights twice or more, and 64-row swap-AB blocks
# with 8 warps; then GEMM 1 swapped beside GEMM 2 in the usual order (timed alone, GEMM 2 ran
# 1.05-1.10x faster so), with and without N grouping, and on 8 warps.
W8A8X2_PREFILL_CANDIDATES = (
    (32, (128, 128, 4, 3, True), (128, 128, 4, 4, True)),
    (32, (64, 128, 4, 4, True), (128, 128, 4, 4, True)),
    (16, (128, 128, 4, 3, True), (128, 128, 4, 4, True)),
    (64, (128, 128, 8, 3, True), (128, 128, 8, 3, True)),
    (64, (128, 128, 8, 3, True), (128, 128, 4, 4, False)),
    (64, (128, 128, 8, 3, True), (128, 128, 4, 4, False, 8)),
    (64, (128, 128, 8, 3, True), (128, 128, 8, 3, False)),
)
# w8a16 (fp8 weights scaled in registers into 16-bit dots): both GEMMs in the usual order (the rule
# before GEMM 1 took swap-AB at 128-row blocks), then swap-AB for both: the scaled weights are
# wgmma's register operand and the activations come straight from memory, so the dots chain on the
# accumulator and stay in flight across K steps; in the usual order the scaled weight tile is
# stored to shared memory each step and every dot is waited for.
W8A16_PREFILL_CANDIDATES = (
    (128, (128, 64, 8, 3, False, 16), (128, 64, 8, 3, False, 16)),
    (128, (128, 64, 8, 3, True, 8), (128, 64, 8, 3, True, 8)),
    (128, (128, 128, 8, 3, True, 8), (128, 128, 8, 3, True, 8)),
    (64, (128, 128, 4, 3, True, 8), (128, 128, 4, 3, True, 8)),
    (128, (64, 128, 8, 3, True, 16), (128, 128, 8, 3, True, 16)),
    (64, (64, 128, 4, 4, True, 16), (128, 128, 4, 4, True, 16)),
    # 64-row blocks, GEMM 1 alone swapped with 8 warps (4 spill registers there), GEMM 2 as the rule
    (64, (128, 128, 8, 3, True, 8), (128, 64, 4, 4, False, 16)),
    (64, (128, 64, 8, 4, True, 8), (128, 64, 4, 4, False, 16)),
    (64, (128, 128, 8, 4, True, 16), (128, 64, 4, 4, False, 16)),
)
# w8a16 at decode: swap-AB puts the scaled weights in wgmma's M (64 rows at least) and the block's
# few rows in its N, instead of 16-row mma.sync tiles with the weights stored to shared memory; the
# last is the usual order, timed again in the same sweep as a control.
W8A16_DECODE_CANDIDATES = (
    (16, (64, 128, 4, 4, True), (64, 128, 4, 4, True)),
    (16, (128, 128, 4, 3, True), (128, 128, 4, 3, True)),
    (16, (64, 128, 4, 4, True), (64, 128, 4, 4, False)),
    (16, (64, 128, 4, 4), (64, 128, 4, 4)),
)
DECODE_CANDIDATES = (
    (16, (32, 256, 4, 3), (32, 256, 4, 3)),
    (16, (64, 128, 4, 4), (64, 128, 4, 4)),
    (16, (32, 128, 2, 4), (32, 128, 2, 4)),
    (16, (16, 256, 4, 3), (32, 128, 4, 4)),
)
# Repacked mxfp4 (BLOCK_K 128, one step of words) at decode: the usual order at 16 and 32 weight
# rows on 2 and 4 warps (the 1-token tiles of the rule before the step-major words among them), and
# the rule's swap-AB tiles (4 stages) on 6 and 8 stages.
MXFP4_DECODE_CANDIDATES = (
    (16, (32, 128, 4, 4), (32, 128, 4, 4)),
    (16, (16, 128, 4, 4), (16, 128, 4, 4)),
    (16, (32, 128, 2, 4), (32, 128, 2, 4)),
    (16, (16, 128, 2, 4), (16, 128, 2, 4)),
    (16, (32, 128, 4, 6, True), (64, 128, 4, 6, True)),
    (16, (32, 128, 4, 8, True), (64, 128, 4, 8, True)),
    (16, (16, 128, 4, 4, True), (32, 128, 4, 4, True)),
)
# The rule's own tiles with shallower pipelines: (stages fewer for GEMM 1, for GEMM 2), timed at
# every point of a sweep where the rule runs the GEMMs.
SHALLOWER = ((0, 1), (1, 1))
# bf16 prefill at 128-row blocks: the rule's tiles (their N grouping kept) with these fields
# replaced, (GEMM 1, GEMM 2): the tiles before configs.WIDE_PREFILL_STAGES (GEMM 1 on 3 stages; GEMM 2
# 128 wide on 3 too; SHALLOWER times 256 wide on 3).
WIDER_DEEPER = (
    (dict(num_stages=3), {}),
    (dict(num_stages=3), dict(block_n=128, num_stages=3)),
)
# Each GEMM's N grouping the other way from the rule's (groups of configs.group_m where it walks
# each block's N tiles in turn, and back), (GEMM 1, GEMM 2); at decode too, where the rule groups
# only per-route blocks (configs.PER_ROUTE_GROUP_M).
REGROUPED = ((True, False), (False, True), (True, True))
# At decode, where the rule has no groups, also both GEMMs in groups of this many blocks: vLLM
# 0.33.0's GROUP_SIZE_M in its tuned H100 table for gpt-oss-120b at 8 tokens (more than the blocks
# a call has: the blocks walk each N tile in turn).
DECODE_GROUP_M = 64
# At decode, the K splits (GEMM 1, GEMM 2) in place of the rule's (configs.split_k_for), those
# that leave every split a K step.
SPLITS = ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (8, 2), (8, 4))
# --sweep's families of alternatives: other tiles, the wgmma bf16 prefill tiles' predecessors
# (WIDER_DEEPER), REGROUPED, SHALLOWER, grouping routes by expert where the rule runs a block per
# route, a block per route where the rule groups few routes (under an expert map), and SPLITS.
SWEEPS = ("tiles", "deeper", "regrouped", "shallower", "grouped", "per_route", "split_k")
# The launches of the grouping column: under w8a8 the first also quantizes x.
GROUPING_STAGES = ("align", "align_quantize_x", "count_routes", "count_routes_quantize_x", "scatter_routes")


def parse_point(point: str):
    """model:format:tokens[:w8a8|:w8a8x2] -> (spec, tokens, fp8_act); deepseek-v3 runs as one EP8
    rank."""
    model, fmt, tokens, *mode = point.split(":")
    overrides = {"num_local_experts": 32} if model == "deepseek-v3" else {}
    fp8_act = {(): None, ("w8a8",): True, ("w8a8x2",): "x2"}[tuple(mode)]
    return presets.get(model).spec(fmt, **overrides), int(tokens), fp8_act


def _median_us(calls) -> float:
    return time_calls("cuda", calls, warmup=3, iters=10).median_s * 1e6


def stage_times(kernel, prepared, sets) -> dict:
    outs = [torch.empty_like(x) for x, _, _ in sets]
    per_set = [kernel.launches(x, tw, ti, prepared.data, o).stages
               for (x, tw, ti), o in zip(sets, outs, strict=True)]
    for launches in per_set:  # fill the scratch every stage reads
        for _, launch in launches:
            launch()
    times = {}
    for i, (name, _) in enumerate(per_set[0]):
        times[name] = _median_us([launches[i][1] for launches in per_set])
    times["call"] = _median_us([lambda ls=ls: [launch() for _, launch in ls] for ls in per_set])
    return times


def _swept(kernel, tokens: int, changes):
    """Put the rule's config for `tokens`, with the fields `changes(config)` returns replaced, in
    the rule's place."""
    kernel._configs.clear()
    config = kernel.config(tokens)
    kernel._configs[config.tokens_bucket] = attrs.evolve(config, reasons=("swept",), **changes(config))


def with_config(kernel, tokens: int, block_m: int, g1: tuple, g2: tuple):
    """The rule's config for `tokens` with these tiles in its place."""
    _swept(kernel, tokens, lambda config: dict(
        block_m=block_m, gemm1=configs.GemmConfig(*g1), gemm2=configs.GemmConfig(*g2),
        h_fp8=config.fp8_act and g1[0] == 128))


def grouped(kernel, tokens: int):
    """The rule's config for `tokens` with its routes grouped by expert (the grouping launch first)
    where the rule runs a block per route."""
    _swept(kernel, tokens, lambda config: dict(per_route=False))


def per_route(kernel, tokens: int):
    """The rule's config for `tokens` with a block per route (no grouping launch; the routes walk
    the N tiles in groups of configs.PER_ROUTE_GROUP_M) where the rule groups its few routes."""
    def together(gemm):
        return attrs.evolve(gemm, group_m=configs.PER_ROUTE_GROUP_M)

    _swept(kernel, tokens, lambda config: dict(per_route=True, gemm1=together(config.gemm1),
                                               gemm2=together(config.gemm2)))


def resplit(kernel, tokens: int, split1: int, split2: int):
    """The rule's config for `tokens` with K split split1 / split2 ways in GEMM 1 / 2."""
    _swept(kernel, tokens, lambda config: dict(gemm1=attrs.evolve(config.gemm1, split_k=split1),
                                               gemm2=attrs.evolve(config.gemm2, split_k=split2)))


def shallower(kernel, tokens: int, gemm1_by: int, gemm2_by: int):
    """The rule's config for `tokens` with each GEMM's pipeline that many stages shallower (two at
    least)."""
    def less(gemm, by):
        return attrs.evolve(gemm, num_stages=max(2, gemm.num_stages - by))

    _swept(kernel, tokens, lambda config: dict(gemm1=less(config.gemm1, gemm1_by),
                                               gemm2=less(config.gemm2, gemm2_by)))


def evolved(kernel, tokens: int, gemm1_changes: dict, gemm2_changes: dict):
    """The rule's config for `tokens` with these fields of each GEMM's tiles replaced."""
    _swept(kernel, tokens, lambda config: dict(gemm1=attrs.evolve(config.gemm1, **gemm1_changes),
                                               gemm2=attrs.evolve(config.gemm2, **gemm2_changes)))


def regrouped(kernel, tokens: int, gemm1: bool, gemm2: bool, l2_bytes: int, size: Optional[int] = None):
    """The rule's config for `tokens` with the N grouping of the GEMMs marked True the other way
    round: groups of `size`, or of configs.group_m (its size before any cap the rule puts on it,
    such as configs.W8A16_SWAP_GROUP_M), where the rule has none, none where it has some."""
    def flipped(config, gemm, k):
        group = size or configs.group_m(config.block_m, k, 8 if config.fp8_act else 16, l2_bytes)
        return attrs.evolve(gemm, group_m=1 if gemm.group_m > 1 else group)

    _swept(kernel, tokens, lambda config: dict(
        gemm1=flipped(config, config.gemm1, kernel.spec.hidden_size) if gemm1 else config.gemm1,
        gemm2=flipped(config, config.gemm2, kernel.spec.intermediate_size) if gemm2 else config.gemm2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=",".join(DEFAULT_POINTS))
    parser.add_argument("--sweep", nargs="?", const=",".join(SWEEPS), default="",
                        help="also time alternative launch configs, of these families (default all): "
                             + ", ".join(SWEEPS))
    args = parser.parse_args(argv)
    sweep = set(filter(None, args.sweep.split(",")))
    if sweep - set(SWEEPS):
        parser.error(f"--sweep: unknown families {sorted(sweep - set(SWEEPS))}; from {', '.join(SWEEPS)}")
    target = Target("cuda:0", hal.probe(deep=True))
    print(f"# triton_moe stages on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| point | config | quantize x (alone) | grouping (w8a8: and quantize x) | gemm1 (GEMV 1) "
          "| gemm2 (GEMV 2 + top-k sum) | top_k_sum | call (us) |")
    print("|---|---|---|---|---|---|---|---|")
    for point in args.points.split(","):
        spec, tokens, fp8_act = parse_point(point)
        weights = device_weights(spec, 7, "cuda")  # made on the GPU: host generation takes minutes
        expert_map = weights.expert_map
        sets, _, _ = input_sets(spec, tokens, "uniform", ROTATE, "cuda", expert_map)
        kernel = TritonMoEKernel(spec, target, fp8_act=fp8_act)
        prepared = kernel.prepare_weights(weights)
        rule = kernel.config(tokens)
        candidates = [None]
        if "tiles" in sweep:
            if rule.fp8_act and rule.act_terms == 2 and rule.block_m >= 64:
                candidates += list(W8A8X2_PREFILL_CANDIDATES)
            elif rule.fp8_act:
                candidates += list(W8A8_PREFILL_CANDIDATES if rule.block_m >= 64 else W8A8_DECODE_CANDIDATES)
            elif spec.weight_format == "fp8_block128":
                fp8_candidates = W8A16_PREFILL_CANDIDATES if rule.block_m >= 64 else W8A16_DECODE_CANDIDATES
                candidates += list(fp8_candidates)
            elif spec.weight_format == "mxfp4" and rule.block_m < 64:
                candidates += list(MXFP4_DECODE_CANDIDATES)
            else:
                candidates += list(PREFILL_CANDIDATES if rule.block_m >= 64 else DECODE_CANDIDATES)
        if "deeper" in sweep and rule.block_m >= 128 and spec.weight_format == "bf16" and not rule.fp8_act:
            candidates += [("evolved", *changes) for changes in WIDER_DEEPER]
        if "regrouped" in sweep and rule.gemv1 is None:
            candidates += [("regrouped", *which) for which in REGROUPED]
            if rule.block_m < 64 and rule.gemm1.group_m == 1:
                candidates.append(("regrouped", True, True, DECODE_GROUP_M))
        if "shallower" in sweep and rule.gemv1 is None:
            candidates += [("shallower", *by) for by in SHALLOWER]
        if "grouped" in sweep and rule.per_route:
            candidates.append(("grouped",))
        if ("per_route" in sweep and not rule.per_route and rule.gemv1 is None
                and configs.few_routes(spec, rule.tokens_bucket)):
            candidates.append(("per_route",))
        if "split_k" in sweep and rule.gemv1 is None and rule.block_m <= 32:
            steps = (math.ceil(spec.hidden_size / rule.gemm1.block_k),
                     math.ceil(spec.intermediate_size / rule.gemm2.block_k))
            candidates += [("split_k", *pair) for pair in SPLITS
                           if pair != (rule.gemm1.split_k, rule.gemm2.split_k)
                           and pair[0] <= steps[0] and pair[1] <= steps[1]]
        for candidate in candidates:
            if candidate is None:
                pass
            elif candidate[0] == "split_k":
                resplit(kernel, tokens, *candidate[1:])
            elif candidate[0] == "grouped":
                grouped(kernel, tokens)
            elif candidate[0] == "per_route":
                per_route(kernel, tokens)
            elif candidate[0] == "shallower":
                shallower(kernel, tokens, *candidate[1:])
            elif candidate[0] == "evolved":
                evolved(kernel, tokens, *candidate[1:])
            elif candidate[0] == "regrouped":
                regrouped(kernel, tokens, *candidate[1:3], target.gpu.l2_bytes or configs.DEFAULT_L2,
                          *candidate[3:])
            else:
                with_config(kernel, tokens, *candidate)
            config = kernel.config(tokens)
            label = config.describe() + ("; a block per route" if config.per_route else "")
            try:
                t = stage_times(kernel, prepared, sets)
            except Exception as exc:  # a candidate that does not compile or fit is reported, not fatal
                print(f"| {point} | {label} | failed: {type(exc).__name__}: {str(exc)[:80]} ||||||")
                continue
            grouping = sum(t.get(name, 0.0) for name in GROUPING_STAGES)
            print(f"| {point} | {label} | {t.get('quantize_x', 0.0):.1f} | {grouping:.1f} | "
                  f"{t.get('gemm1', t.get('gemv1', 0.0)):.1f} | "
                  f"{t.get('gemm2', t.get('gemv2_top_k_sum', 0.0)):.1f} | {t.get('top_k_sum', 0.0):.1f} | "
                  f"{t['call']:.1f} |",
                  flush=True)
        kernel._configs.clear()
        del prepared, weights, sets
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
