"""Reads a `hal bench moe --json` result and prints the issue-5 comparison, one row per token
count: Marlin's median next to its two baselines (first-valid config, runtime-branch build) and the
torch reference, with weight GB/s against the 4.3 TB/s decode target and TFLOP/s against the bf16
matmul rate measured in the same run.

    python -m backends.marlin.bench_table bench.json
"""

from __future__ import annotations

import json
import sys

DECODE_TARGET_GBPS = 4300.0  # the H200 decode reference bandwidth (HBM3e, GB/s)
MAIN = "marlin"
BASELINES = ("marlin:first_valid", "marlin:runtime_branch", "reference")


def table(payload: dict) -> str:
    ceil = payload["ceilings"]
    by = {}
    for row in payload["rows"]:
        by.setdefault((row["routing"], row["tokens"]), {})[row["variant"]] = row
    lines = [f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s, bf16 matmul {ceil['bf16_tflops']:.1f} TFLOP/s",
             f"{'routing':>8} {'M':>5} {'marlin us':>10} {'first_valid':>12} {'runtime_br':>12} "
             f"{'reference':>12} {'GB/s':>7} {'%4.3TB':>6} {'TFLOP/s':>8} {'%bf16':>6}"]
    for (routing, tokens), rows in sorted(by.items()):
        main = rows.get(MAIN)
        if main is None:
            continue
        t = main["timing"]["median_s"]
        cells = []
        for name in BASELINES:
            other = rows.get(name)
            cells.append(f"{other['timing']['median_s'] / t:6.2f}x" if other else "      -")
        lines.append(f"{routing[:8]:>8} {tokens:>5} {t * 1e6:10.1f} {cells[0]:>12} {cells[1]:>12} "
                     f"{cells[2]:>12} {main['gbps']:7.0f} {main['gbps'] / DECODE_TARGET_GBPS:6.0%} "
                     f"{main['tflops']:8.1f} {main['tflops'] / ceil['bf16_tflops']:6.0%}")
    lines.append("baseline columns: the baseline's median over marlin's (> 1: marlin is faster)")
    return "\n".join(lines)


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        print(table(json.load(handle)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
