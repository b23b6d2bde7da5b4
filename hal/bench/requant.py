"""The requant benchmark: per-token-group -> per-tensor FP8 on the masked layout, the selected
kernel against its baselines (the legacy launch geometry), over hidden sizes, local expert counts,
rows per expert and routing skew."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

import attrs

from hal.bench import machine
from hal.bench.ceilings import Ceilings
from hal.bench.table import table_lines
from hal.bench.timing import DEFAULT_ITERS, DEFAULT_WARMUP, Timing, time_calls
from hal.spec import TOKEN_GROUP

# Rotate input sets until their live bytes reach this, twice the H200's 60 MB L2, so small cases
# measure memory rather than the cache left warm by the previous replay.
ROTATE_BYTES = 120 << 20
MAX_ROTATE = 64  # launches per replayed graph
# Allocated input sets per point at most (512 experts x 2048 rows fit on a 141 GB GPU); lowered to
# a share of the free memory on smaller machines (hal.bench.machine).
MAX_SETS_BYTES = 24 << 30


@attrs.frozen
class RequantRow:
    hidden: int
    experts: int
    rows_per_expert: int
    skew: int
    expected_rows: int
    variant: str
    timing: Timing
    max_m: int  # rows allocated per expert (DeepEP allocates a fixed buffer)
    bytes_moved: int  # live rows: fp8 in + fp8 out + fp32 scales
    gbps: float
    vs_floor: float  # median over the floor (empty launch, or bytes at the copy rate): >= 1
    vs_baseline: Optional[float]


@attrs.frozen
class RequantBench:
    device: str
    ceilings: Ceilings
    baseline: Optional[str]
    rows: tuple
    skipped: tuple = ()  # points whose one input set did not fit the memory budget, and why


def skewed_rows(experts: int, rows: int, skew: int) -> list:
    """One hot expert takes skew x rows; the others share what is left, so the total stays
    experts x rows."""
    total = experts * rows
    hot = min(skew * rows, total)
    if experts == 1:
        return [total]
    rest, extra = divmod(total - hot, experts - 1)
    return [hot] + [rest + (1 if i < extra else 0) for i in range(experts - 1)]


@attrs.frozen
class PointInputs:
    """The rotated input sets of one benchmark point and what the dispatcher would report for it."""

    sets: list  # (x, x_scale, masked_m) per set
    max_m: int
    expected_rows: int  # (live rows + E) // E, as DeepEP's dispatcher reports it
    live_bytes: int  # per set: fp8 in + fp8 out + fp32 scales of the live rows


def set_bytes(hidden: int, experts: int, max_m: int) -> int:
    """One allocated input set with its output: fp8 in + fp8 out + fp32 scales, every row."""
    return experts * max_m * (2 * hidden + 4 * (hidden // TOKEN_GROUP))


def point_inputs(device: str, hidden: int, experts: int, rows: int, skew: int, fp8_dtype,
                 min_max_m: int = 0, budget: int = MAX_SETS_BYTES) -> Optional[PointInputs]:
    """Inputs for `experts` x `rows` rows of `hidden` columns, one expert taking `skew` x rows, rotated
    until their live bytes pass ROTATE_BYTES or the sets fill `budget` bytes; None when one set
    alone does not fit in `budget`."""
    from hal.synth import random_masked_inputs

    masked = skewed_rows(experts, rows, skew)
    max_m = max(max(masked), min_max_m)
    live = sum(masked)
    row_bytes = 2 * hidden + 4 * (hidden // TOKEN_GROUP)
    per_set = live * row_bytes
    one_set = set_bytes(hidden, experts, max_m)
    if one_set > budget:
        return None
    rotate = max(1, min(MAX_ROTATE, -(-ROTATE_BYTES // max(per_set, 1)), budget // one_set))
    sets = [random_masked_inputs(experts, hidden, max_m, masked, seed=i, device=device,
                                 fp8_dtype=fp8_dtype) for i in range(rotate)]
    return PointInputs(sets, max_m, (live + experts) // experts, per_set)


def run(device: str, caps, hidden: Sequence[int], experts: Sequence[int], rows: Sequence[int],
        skews: Sequence[int], *, backend: Optional[str] = None, min_max_m: int = 0,
        warmup: int = DEFAULT_WARMUP,
        iters: int = DEFAULT_ITERS, ceilings: Optional[Ceilings] = None, log=sys.stderr) -> RequantBench:
    import torch

    from hal.bench import ceilings as ceiling_probe
    from hal.registry import select_requant_kernel
    from hal.spec import RequantSpec

    budget = machine.input_budget(device, MAX_SETS_BYTES)
    print(f"[hal bench] measuring ceilings on {device} ...", file=log, flush=True)
    ceilings = ceilings or ceiling_probe.measure(device)
    print(f"[hal bench] {ceilings.describe()}; inputs up to {machine.gib(budget)} per point",
          file=log, flush=True)
    out_rows, baseline, skipped = [], None, []
    for h in hidden:
        for e in experts:
            main = select_requant_kernel(RequantSpec(e, h), device, caps=caps, prefer=backend)
            kernels = [(main.backend, main)] + [(f"{main.backend}:{n}", k)
                                                 for n, k in main.baselines().items()]
            baseline = kernels[1][0] if len(kernels) > 1 else None
            for r in rows:
                for skew in skews:
                    point = point_inputs(device, h, e, r, skew, main.fp8_dtype, min_max_m, budget)
                    if point is None:
                        max_m = max(max(skewed_rows(e, r, skew)), min_max_m)
                        why = (f"H={h} E={e} rows={r} skew={skew}: one input set needs "
                               f"{machine.gib(set_bytes(h, e, max_m))}, over the "
                               f"{machine.gib(budget)} budget on {device}")
                        print(f"[hal bench] skip {why}", file=log, flush=True)
                        skipped.append(why)
                        continue
                    scale = torch.tensor([0.05], device=device)
                    timings = {}
                    for label, kernel in kernels:
                        outs = [torch.empty(x.shape, dtype=x.dtype, device=device)
                                for x, _, _ in point.sets]
                        calls = [(lambda k=kernel, s=s, o=o, c=scale, n=point.expected_rows:
                                  k(s[0], s[1], s[2], c, out=o, expected_rows=n, check=False))
                                 for s, o in zip(point.sets, outs, strict=True)]
                        timings[label] = time_calls(device, calls, warmup, iters)
                    per_set = point.live_bytes
                    floor = ceilings.floor_s(per_set)
                    for label, t in timings.items():
                        out_rows.append(RequantRow(
                            h, e, r, skew, point.expected_rows, label, t, point.max_m, per_set,
                            per_set / t.median_s / 1e9, t.median_s / floor,
                            timings[baseline].median_s / t.median_s if baseline else None))
                    best = timings[main.backend].median_s
                    print(f"[hal bench] H={h} E={e} rows={r} skew={skew}: {best * 1e6:.1f} us"
                          + (f", {baseline} {timings[baseline].median_s * 1e6:.1f} us" if baseline else ""),
                          file=log, flush=True)
    return RequantBench(device, ceilings, baseline, tuple(out_rows), tuple(skipped))


def format_table(result: RequantBench, markdown: bool = False) -> str:
    head = ("H", "E", "rows", "skew", "expected", "max_m", "variant", "median us", "GB/s",
            "x floor", "x base", "timing")
    body = [(str(r.hidden), str(r.experts), str(r.rows_per_expert), str(r.skew), str(r.expected_rows),
             str(r.max_m), r.variant, f"{r.timing.median_s * 1e6:.2f}", f"{r.gbps:.0f}",
             f"{r.vs_floor:.2f}", "-" if r.vs_baseline is None else f"{r.vs_baseline:.2f}",
             r.timing.method) for r in result.rows]
    notes = [result.ceilings.describe(),
             "x floor: median over max(empty launch, bytes / copy rate); x base: the baseline's "
             "median over the row's (> 1 is faster)"]
    notes += [f"skipped {why}" for why in result.skipped]
    return "\n".join(notes + [""] + table_lines(head, body, markdown))

