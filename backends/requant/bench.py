"""Requant benchmark on one GPU: the tuned launch against the legacy one, side by side, with the
floor of each point.

    python -m backends.requant.bench [--hidden 7168,3584] [--experts 8,32,56,128,256,512]
        [--rows 1,8,32,128] [--skew 1,4,16] [--max-m-floor 0] [--json out.json]

Timing is hal.bench.timing (a CUDA graph of one launch per rotated input set, replayed), the copy
ceiling is hal.bench.ceilings, the routing is hal.bench.requant.skewed_rows and expected rows are
what DeepEP's dispatcher reports, (rows + E) // E. Inputs are made on the GPU (host-made inputs of
512 experts x 2048 rows x 7168 would take minutes), and rotated until the live bytes exceed twice
the L2, so mid-size points time memory rather than a warm cache.

floor = max(an empty kernel's launch under the same graph timing, live bytes / 4.3 TB/s), the
issue's definition; the copy rate measured in the run is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import attrs
import torch
import triton

# Rotate input sets until the live bytes reach this, twice the H200's 60 MB L2.
ROTATE_BYTES = 120 << 20
# At most this many input sets per point (launches per graph), and at most this much memory for
# them, so 512 experts x 2048 rows still fit beside the outputs.
MAX_ROTATE = 64
MAX_SET_BYTES = 24 << 30
# GB/s: the H200's device-to-device copy rate recorded on these machines (bytes read + written),
# the bandwidth term of the floor.
FLOOR_COPY_GBPS = 4300.0
# Samples per timing: each sample is >= 20 ms of replays (hal.bench.timing), so 7 give a median
# stable to a few percent and keep the whole 144-point sweep near a minute of device time.
ITERS = 7
WARMUP = 2


@attrs.frozen
class Point:
    hidden: int
    experts: int
    rows_per_expert: int
    skew: int
    max_m: int
    expected_rows: int
    live_bytes: int
    tuned_us: float
    legacy_us: float
    floor_us: float
    plan: str

    @property
    def speedup(self) -> float:
        return self.legacy_us / self.tuned_us

    @property
    def gbps(self) -> float:
        return self.live_bytes / self.tuned_us / 1e3

    @property
    def vs_floor(self) -> float:
        return self.tuned_us / self.floor_us


def _input_set(experts, max_m, hidden, masked, fp8_dtype, device):
    groups = hidden // 128
    x = torch.empty(experts, max_m, hidden, dtype=torch.uint8, device=device)
    x.random_(0, 0x7F)  # every positive finite e4m3 code; the sign does not change the timing
    scale = (torch.rand(experts, groups, max_m, device=device) * 0.01 + 0.01).transpose(1, 2)
    return x.view(fp8_dtype), scale, torch.tensor(masked, dtype=torch.int32, device=device)


@triton.jit
def _empty_kernel(unused_ptr):
    pass


def launch_floor_us(device: str) -> float:
    """An empty Triton kernel, timed as the requant is: one graph of MAX_ROTATE launches."""
    from hal.bench.timing import time_calls

    unused = torch.zeros(1, device=device)
    calls = [lambda: _empty_kernel[(1,)](unused)] * MAX_ROTATE
    return time_calls(device, calls, WARMUP, ITERS).median_s * 1e6


def measure(args) -> dict:
    import hal
    from backends.requant import backend
    from hal.backend import Target
    from hal.bench import ceilings
    from hal.bench.requant import skewed_rows
    from hal.bench.timing import time_calls

    device = args.device
    caps = hal.probe(deep=True)
    target = Target(device, caps)
    ceiling = ceilings.measure(device)
    empty_us = launch_floor_us(device)
    print(f"[requant bench] {ceiling.describe()}; empty launch {empty_us:.2f} us", file=sys.stderr)
    points = []
    for hidden in args.hidden:
        for experts in args.experts:
            kernel = backend.build(hal.RequantSpec(experts, hidden), target)
            legacy = kernel.baselines()["legacy"]
            for rows in args.rows:
                for skew in args.skew:
                    masked = skewed_rows(experts, rows, skew)
                    max_m = max(max(masked), args.max_m_floor)
                    live = sum(masked)
                    expected = (live + experts) // experts
                    live_bytes = live * (2 * hidden + 4 * (hidden // 128))
                    set_bytes = experts * max_m * (2 * hidden + 4 * (hidden // 128))
                    rotate = max(1, min(MAX_ROTATE, -(-ROTATE_BYTES // max(live_bytes, 1)),
                                        MAX_SET_BYTES // set_bytes))
                    sets = [_input_set(experts, max_m, hidden, masked, kernel.traits.fp8_dtype, device)
                            for _ in range(rotate)]
                    outs = [torch.empty_like(x) for x, _, _ in sets]
                    s_out = torch.tensor([0.05], device=device)
                    timings = {}
                    for name, k in (("tuned", kernel), ("legacy", legacy)):
                        calls = [(lambda k=k, s=s, o=o, s_out=s_out, expected=expected:
                                  k(s[0], s[1], s[2], s_out, out=o, expected_rows=expected, check=False))
                                 for s, o in zip(sets, outs, strict=True)]
                        timings[name] = time_calls(device, calls, WARMUP, args.iters).median_s * 1e6
                    floor = max(empty_us, live_bytes / FLOOR_COPY_GBPS / 1e3)
                    point = Point(hidden, experts, rows, skew, max_m, expected, live_bytes,
                                  timings["tuned"], timings["legacy"], floor,
                                  kernel.plan(max_m, expected).describe())
                    points.append(point)
                    print(f"H={hidden} E={experts} rows={rows} skew={skew} max_m={max_m} "
                          f"exp={expected}: tuned {point.tuned_us:.2f} us legacy "
                          f"{point.legacy_us:.2f} us x{point.speedup:.2f}, floor {floor:.2f} us "
                          f"(tuned/floor {point.vs_floor:.2f})", file=sys.stderr, flush=True)
                    del sets, outs
    gpu = target.gpu
    return dict(device=gpu.name if gpu is not None else device, torch=torch.__version__,
                copy_gbps=ceiling.copy_gbps, empty_launch_us=empty_us,
                points=[dict(attrs.asdict(p), speedup=p.speedup, gbps=p.gbps, vs_floor=p.vs_floor)
                        for p in points])


def markdown(result: dict) -> str:
    lines = [f"device {result['device']}, torch {result['torch']}; copy measured in this run "
             f"{result['copy_gbps']:.0f} GB/s; floor = max(empty launch "
             f"{result['empty_launch_us']:.2f} us, bytes / {FLOOR_COPY_GBPS:.0f} GB/s)", "",
             "| hidden | experts | rows/expert | skew | expected | legacy us | tuned us | x legacy "
             "| tuned GB/s | floor us | tuned/floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        lines.append(f"| {p['hidden']} | {p['experts']} | {p['rows_per_expert']} | {p['skew']} | "
                     f"{p['expected_rows']} | {p['legacy_us']:.2f} | {p['tuned_us']:.2f} | "
                     f"{p['speedup']:.2f} | {p['gbps']:.0f} | {p['floor_us']:.2f} | "
                     f"{p['vs_floor']:.2f} |")
    return "\n".join(lines)


def targets(result: dict) -> str:
    """The issue's four targets, read off the measured points."""
    pts = result["points"]
    lines = []
    decode = [p for p in pts if (p["hidden"], p["experts"], p["rows_per_expert"], p["skew"])
              == (7168, 256, 1, 1)]
    if decode:
        lines.append(f"256 experts x 1 row x 7168: x{decode[0]['speedup']:.2f} vs legacy (target >= 10)")
    worst = min(pts, key=lambda p: p["speedup"])
    lines.append(f"slowest vs legacy: x{worst['speedup']:.2f} at H={worst['hidden']} "
                 f"E={worst['experts']} rows={worst['rows_per_expert']} skew={worst['skew']} "
                 "(target >= 0.97)")
    base = {(p["hidden"], p["experts"], p["rows_per_expert"]): p["tuned_us"] for p in pts
            if p["skew"] == 1}
    skew16 = [(p["tuned_us"] / base[(p["hidden"], p["experts"], p["rows_per_expert"])], p) for p in pts
              if p["skew"] == 16 and (p["hidden"], p["experts"], p["rows_per_expert"]) in base]
    if skew16:
        ratio, p = max(skew16, key=lambda item: item[0])
        lines.append(f"worst skew 16 / skew 1: {ratio:.2f} at H={p['hidden']} E={p['experts']} "
                     f"rows={p['rows_per_expert']} (target <= 1.3)")
    far = max(pts, key=lambda p: p["vs_floor"])
    lines.append(f"farthest from the floor: {far['vs_floor']:.2f}x at H={far['hidden']} "
                 f"E={far['experts']} rows={far['rows_per_expert']} skew={far['skew']} (target <= 1.3); "
                 f"median tuned/floor {statistics.median(p['vs_floor'] for p in pts):.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from hal.cli.spec_args import int_list

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int_list, default=int_list("7168,3584"))
    p.add_argument("--experts", type=int_list, default=int_list("8,32,56,128,256,512"))
    p.add_argument("--rows", type=int_list, default=int_list("1,8,32,128"))
    p.add_argument("--skew", type=int_list, default=int_list("1,4,16"))
    p.add_argument("--max-m-floor", type=int, default=0,
                   help="allocate at least this many rows per expert, as DeepEP's fixed buffer does")
    p.add_argument("--iters", type=int, default=ITERS)
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu under TRITON_INTERPRET=1 (smoke test)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    result = measure(args)
    result["command"] = "python -m backends.requant.bench " + " ".join(sys.argv[1:] if argv is None
                                                                      else argv)
    print(markdown(result))
    print()
    print(targets(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
