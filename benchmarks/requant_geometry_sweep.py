"""Time explicit requant launch geometries against the legacy launch at chosen points, to set the
rules in backends/requant/tuning.py from measurements. Same inputs, rotation, memory budget and
CUDA-graph timing as `hal bench requant`. Every geometry's output is checked byte for byte against
the legacy one.

    python benchmarks/requant_geometry_sweep.py [--iters 3] > sweep.jsonl 2> sweep.txt

stdout: one JSON line per point with every geometry's median (us); stderr: per point, the tuned
rule's pick and the six fastest geometries."""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
from hal.backends.requant.geometry import RequantGeometry, requant_launch_geometry
from hal.backends.requant.op import fp8_per_token_to_per_tensor

from hal.bench import machine
from hal.bench.requant import MAX_SETS_BYTES, point_inputs
from hal.bench.timing import time_calls
from hal.spec import TOKEN_GROUP

POINTS = (  # hidden, experts, rows per expert, skew
    (7168, 256, 1, 1), (7168, 512, 1, 1), (7168, 128, 1, 1), (7168, 56, 1, 1), (7168, 32, 1, 1),
    (7168, 8, 1, 1), (7168, 8, 1, 16), (7168, 8, 8, 1), (7168, 8, 8, 4), (7168, 8, 8, 16),
    (3584, 8, 8, 4), (7168, 8, 32, 16), (7168, 56, 8, 4), (7168, 256, 8, 1), (3584, 32, 8, 4),
)
SMOKE_POINTS = ((1024, 4, 2, 4),)  # --device cpu, under TRITON_INTERPRET=1
G_BLOCKS = (8, 16, 32)
M_GRIDS = (1, 2, 4, 8, 16, 32)


def sweep_point(device, hidden, experts, rows, skew, iters):
    budget = machine.input_budget(device, MAX_SETS_BYTES)
    point = point_inputs(device, hidden, experts, rows, skew, torch.float8_e4m3fn, budget=budget)
    if point is None:
        raise SystemExit(f"H={hidden} E={experts} rows={rows}: one input set does not fit in "
                         f"{machine.gib(budget)} on {device}")
    sets, max_m, expected = point.sets, point.max_m, point.expected_rows
    out_scale = torch.tensor([0.05], device=device)
    outs = [torch.empty_like(s[0]) for s in sets]
    live_rows = torch.arange(max_m, device=device)[None, :] < sets[0][2][:, None]

    def timed(geometry):
        outs[0].fill_(float("nan"))
        calls = [lambda s=s, o=o: fp8_per_token_to_per_tensor(s[0], s[1], s[2], out_scale, out=o,
                                                              geometry=geometry, check=False)
                 for s, o in zip(sets, outs, strict=True)]
        return time_calls(device, calls, 3, iters).median_s * 1e6

    results = {"legacy": timed("legacy")}
    expect = outs[0].view(torch.uint8)[live_rows].clone()
    caps = sorted({2 * expected, max_m}) if skew > 1 else [min(2 * expected, max_m)]
    for g, m, cap in itertools.product(G_BLOCKS, M_GRIDS, caps):
        if g > hidden // TOKEN_GROUP:
            continue
        key = f"g{g} m{m} cap{cap}"
        results[key] = timed(RequantGeometry(g, m, cap))
        if not torch.equal(outs[0].view(torch.uint8)[live_rows], expect):
            raise SystemExit(f"H={hidden} E={experts}: {key} wrote other bytes than legacy")
    rule = requant_launch_geometry(hidden // TOKEN_GROUP, experts, TOKEN_GROUP, expected, 32, max_m)
    rule_key = f"g{rule.g_block} m{rule.m_grid} cap{min(rule.row_cap, max_m)}"
    return expected, max_m, rule_key, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    args = parser.parse_args()
    for hidden, experts, rows, skew in (POINTS if args.device != "cpu" else SMOKE_POINTS):
        expected, max_m, rule_key, us = sweep_point(args.device, hidden, experts, rows, skew, args.iters)
        print(json.dumps({"hidden": hidden, "experts": experts, "rows": rows, "skew": skew,
                          "expected": expected, "max_m": max_m, "rule": rule_key, "us": us}), flush=True)
        best = sorted(us.items(), key=lambda kv: kv[1])[:6]
        print(f"# H={hidden} E={experts} rows={rows} skew={skew} expected={expected}: legacy "
              f"{us['legacy']:.2f}, rule [{rule_key}] {us.get(rule_key, float('nan')):.2f} | best "
              + ", ".join(f"{k} {v:.2f}" for k, v in best), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
