"""The MoE benchmark: the selected kernel, its baselines (the rule it replaces) and every other
backend that accepts the spec, timed side by side over token counts and routings, on the same
inputs, with ceilings measured in the same run."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

import attrs

from hal.bench import machine, noise
from hal.bench.ceilings import Ceilings
from hal.bench.table import table_lines
from hal.bench.timing import DEFAULT_ITERS, DEFAULT_WARMUP, Timing, time_calls

# Input sets cycled through while timing, so a decode step does not find the previous step's
# experts in cache: 8 sets of top-k routes cover most experts of a 128-expert layer.
DEFAULT_ROTATE = 8


@attrs.frozen
class MoERow:
    tokens: int
    routing: str
    variant: str  # backend, or backend:baseline
    timing: Timing
    weight_bytes: float  # checkpoint bytes of the local experts one call touches (mean over sets)
    flops: float  # 2 x multiply-adds of the routed local tokens
    gbps: float
    tflops: float
    roofline: float  # the floor time (bytes / copy rate, or flops / bf16 rate) over the median
    floor_s: float  # that floor time
    vs_baseline: Optional[float]  # the baseline's median over this row's: > 1 is faster
    vs_reference: Optional[float]


@attrs.frozen
class MoEBench:
    spec: object
    device: str
    threads: Optional[int]
    ceilings: Ceilings
    baseline: Optional[str]
    rows: tuple
    load_per_cpu: Optional[float] = None  # before the run (hal.bench.noise)
    noise: tuple = ()  # one line per sign of a noisy machine


def variants(spec, device: str, caps, backend: Optional[str] = None, include_reference: bool = True,
             include_others: bool = True):
    """[(label, kernel)]: the chosen kernel first, then its baselines, then the other backends that
    accept the spec here (only the reference when include_others is False)."""
    from hal.backend import Target
    from hal.registry import decide, discover, select_moe_kernel

    found = discover()
    main = select_moe_kernel(spec, device, caps=caps, prefer=backend, backends=found)
    out = [(main.backend, main)]
    out += [(f"{main.backend}:{name}", k) for name, k in main.baselines().items()]
    decision = decide(spec, Target(device, caps), found)
    for c in decision.candidates:
        if not c.verdict.ok or c.name == main.backend:
            continue
        if (c.name == "reference" and not include_reference) or \
                (c.name != "reference" and not include_others):
            continue
        out.append((c.name, select_moe_kernel(spec, device, caps=caps, prefer=c.name, backends=found)))
    return out


def check_fits(spec, device: str, variants: int) -> None:
    """A ValueError, before anything is allocated, when the weights and one prepared copy per
    variant would not fit in the memory free on `device`."""
    free = machine.free_bytes(device)
    need = spec.local_experts * spec.weight_bytes_per_expert() * (1 + variants)
    if free is not None and need > free * (1 - machine.INPUT_SHARE):
        raise ValueError(f"the weights and {variants} prepared copies need about {machine.gib(need)}, "
                         f"{machine.gib(free)} is free on {device}: bench fewer experts "
                         "(--local-experts) or fewer variants (--only, --no-reference, --backend)")


def bench_weights(spec, device: str):
    """The benchmark's weights (fixed seed) and, under EP, its expert map, attached to the weights."""
    from hal.synth import random_expert_map, random_weights

    weights = random_weights(spec, device=device, seed=7)
    expert_map = random_expert_map(spec, seed=8, device=device) if spec.is_ep else None
    if expert_map is not None:
        weights = attrs.evolve(weights, expert_map=expert_map)
    return weights, expert_map


def input_sets(spec, tokens: int, routing: str, rotate: int, device: str, expert_map):
    from hal.synth import random_routing, random_tokens

    sets = []
    for i in range(rotate):
        x = random_tokens(spec, tokens, seed=1000 + i, device=device)
        tw, ti = random_routing(spec, tokens, routing, seed=2000 + i, device=device)
        sets.append((x, tw, ti))
    touched, routes = [], []
    for _, _, ti in sets:
        local = ti.long() if expert_map is None else expert_map.long()[ti.long()]
        local = local[local >= 0]
        touched.append(int(local.unique().numel()))
        routes.append(int(local.numel()))
    return sets, sum(touched) / rotate, sum(routes) / rotate


def run(spec, device: str, caps, tokens: Sequence[int], routings: Sequence[str], *,
        backend: Optional[str] = None, threads: Optional[int] = None, rotate: int = DEFAULT_ROTATE,
        warmup: int = DEFAULT_WARMUP, iters: int = DEFAULT_ITERS, include_reference: bool = True,
        include_others: bool = True, ceilings: Optional[Ceilings] = None, log=sys.stderr) -> MoEBench:
    import torch

    from hal.bench import ceilings as ceiling_probe

    if threads:
        torch.set_num_threads(threads)
    load = noise.load_per_cpu()
    kernels = variants(spec, device, caps, backend, include_reference, include_others)
    check_fits(spec, device, len(kernels))
    print(f"[hal bench] measuring ceilings on {device} ...", file=log, flush=True)
    ceilings = ceilings or ceiling_probe.measure(device)
    print(f"[hal bench] {ceilings.describe()}", file=log, flush=True)
    weights, expert_map = bench_weights(spec, device)
    baseline = kernels[1][0] if len(kernels) > 1 and ":" in kernels[1][0] else None
    prepared = {}
    for label, kernel in kernels:
        print(f"[hal bench] preparing weights for {label} ...", file=log, flush=True)
        prepared[label] = kernel.prepare_weights(weights)
    rows = []
    for routing in routings:
        for m in tokens:
            sets, touched, routes = input_sets(spec, m, routing, rotate, device, expert_map)
            outs = [torch.empty_like(x) for x, _, _ in sets]
            weight_bytes = touched * spec.weight_bytes_per_expert()
            flops = routes * spec.flops_per_token()
            timings = {}
            for label, kernel in kernels:
                calls = [(lambda k=kernel, s=s, o=o, p=prepared[label]:
                          k(s[0], s[1], s[2], p, out=o, check=False))
                         for s, o in zip(sets, outs, strict=True)]
                timings[label] = time_calls(device, calls, warmup, iters)
                print(f"[hal bench] {routing:>12} M={m:<5} {label:<24} "
                      f"{timings[label].median_s * 1e6:10.1f} us", file=log, flush=True)
            floor = ceilings.floor_s(weight_bytes, flops)
            for label, t in timings.items():
                rows.append(MoERow(
                    m, routing, label, t, weight_bytes, flops,
                    weight_bytes / t.median_s / 1e9, flops / t.median_s / 1e12, floor / t.median_s, floor,
                    timings[baseline].median_s / t.median_s if baseline else None,
                    timings["reference"].median_s / t.median_s if "reference" in timings else None))
    over = sum(r.roofline > 1 for r in rows)
    warned = noise.warnings_for(ceilings, load, over)
    for line in warned:
        print(f"[hal bench] WARNING: {line}", file=log, flush=True)
    return MoEBench(spec, device, torch.get_num_threads() if device == "cpu" else None, ceilings,
                    baseline, tuple(rows), load, warned)


def format_table(result: MoEBench, markdown: bool = False) -> str:
    s = result.spec
    notes = [f"{s.weight_format} E={s.num_experts} (local {s.local_experts}) top_k={s.top_k} "
             f"H={s.hidden_size} I={s.intermediate_size} {s.activation}{' bias' if s.has_bias else ''} "
             f"on {result.device}" + (f", {result.threads} threads" if result.threads else ""),
             result.ceilings.describe(),
             "GB/s: checkpoint bytes of the experts touched per call; roof: the floor time (those bytes "
             "at the copy rate, or the flops at the bf16 rate) over the median; p10-p90: the spread of "
             "the samples"]
    notes += [f"WARNING, a noisy machine: {line}" for line in result.noise]
    if result.baseline:
        notes.append(f"x base: {result.baseline}'s median over the row's (> 1 is faster)")
    head = ("routing", "M", "variant", "median us", "p10-p90 us", "GB/s", "TFLOP/s", "roof", "x base",
            "x ref", "timing")
    opt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    body = [(r.routing, str(r.tokens), r.variant, f"{r.timing.median_s * 1e6:.1f}",
             f"{r.timing.p10_s * 1e6:.1f}-{r.timing.p90_s * 1e6:.1f}", f"{r.gbps:.1f}",
             f"{r.tflops:.3f}", roof(r.roofline), opt(r.vs_baseline), opt(r.vs_reference),
             r.timing.method) for r in result.rows]
    return "\n".join(notes + [""] + table_lines(head, body, markdown))


def roof(fraction: float) -> str:
    """A fraction of the roofline as a percentage; above 100% it is no figure at all (a ceiling was
    measured low), and says so."""
    return ">100%!" if fraction > 1 else f"{fraction:.0%}"
