"""Microbenchmarks of cpu_brgemm's inner loops (benchmarks/cpu_brgemm_microbench.cpp) on an
AVX-512-BF16 CPU: where a decode call's time goes and what a candidate decoder or prefetch is worth.

    python benchmarks/cpu_brgemm_microbench.py [--threads 16] [--json out.json]

Reports: bit-exactness of the shipped fp8/mxfp4 decoders against the previous ones (every encoding);
ns per K x 32 panel for TinyGEMM at 1-8 rows and for fp8 -> bf16 dequantization (one thread,
panel in cache); ns per BRGEMM call on one panel (AMX); GB/s of a decode-shaped stream (every
thread runs a 1-row TinyGEMM over panels of a 1 GiB buffer) by decoder and prefetch distance,
next to a plain read of the same buffer; us per empty parallel region; and one qwen3-30b-a3b fp8
layer at 1024 tokens on 1 and on all threads, per dispatch policy (how the prefill call scales)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from hal.backends.cpu_brgemm import policy

import hal

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(HERE), "csrc", "cpu")


def build():
    from torch.utils import cpp_extension

    return cpp_extension.load(
        name="cpu_brgemm_microbench", sources=[os.path.join(HERE, "cpu_brgemm_microbench.cpp")],
        extra_include_paths=[CSRC],
        extra_cflags=["-O3", "-fopenmp", f"-DMOE_PREFETCH_BYTES={policy.PREFETCH_BYTES}",
                      *policy.ISA_CFLAGS["avx512bf16"]],
        extra_ldflags=["-fopenmp"], verbose=False)


def layer_scaling(threads: int, tokens: int = 1024, rules=("per_block", "brgemm")) -> dict:
    """Median ms of one qwen3-30b-a3b fp8 layer call (warm, one routing) by threads and policy."""
    from cpu_moe_peer import checkpoint_weights, input_sets

    from hal.presets import PRESETS

    spec = PRESETS["qwen3-30b-a3b"].spec("fp8_block128")
    kernel = hal.select_moe_kernel(spec, "cpu", prefer="cpu_brgemm")
    prepared = kernel.prepare_weights(checkpoint_weights(spec))
    x, tw, ti, out = input_sets(spec, tokens, 1)[0]
    result = {}
    print(f"\n| qwen3-30b-a3b fp8, {tokens} tokens, one routing, warm | ms |\n| --- | --- |")
    for rule in rules:
        k = kernel.with_policy(rule)
        for t in (threads, 1):
            torch.set_num_threads(t)
            k(x, tw, ti, prepared, out=out, check=False)
            times = []
            for _ in range(5 if t > 1 else 2):
                t0 = time.perf_counter()
                k(x, tw, ti, prepared, out=out, check=False)
                times.append(time.perf_counter() - t0)
            result[f"{rule} {t} threads"] = 1e3 * statistics.median(times)
            print(f"| {rule}, {t} threads | {result[f'{rule} {t} threads']:.1f} |", flush=True)
    torch.set_num_threads(threads)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--stream-mib", type=int, default=1024)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cpu = hal.probe().cpu
    if not (cpu.isa.avx512 and cpu.isa.avx512_bf16):
        raise SystemExit("cpu_brgemm_microbench: needs AVX-512-BF16, which this CPU lacks")
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    mb = build()
    out = dict(cpu=cpu.model_name, threads=torch.get_num_threads(), torch=torch.__version__)
    print(f"# {cpu.model_name}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"built in {time.perf_counter() - t0:.1f} s", flush=True)

    out["exactness"] = mb.check_fp8()
    print(f"exactness of the candidate fp8 decoders: {out['exactness']}", flush=True)

    panel = {}
    for k in (2048, 768):
        for decoder in ("previous", "shipped"):
            for rows in (1, 2, 4, 8):
                panel[f"fp8 tiny k{k} {decoder} rows{rows}"] = mb.panel_ns("tiny", decoder, k, rows, 0)
        for decoder in ("previous", "shipped"):
            panel[f"fp8 dequant k{k} {decoder}"] = mb.panel_ns("dequant", decoder, k, 0, 0)
    for decoder in ("mxfp4_previous", "mxfp4_shipped"):
        for rows in (1, 2, 4, 8):
            panel[f"tiny k2880 {decoder} rows{rows}"] = mb.panel_ns("tiny", decoder, 2880, rows, 0)
    for decoder in ("mxfp4_previous", "mxfp4_shipped"):
        panel[f"dequant k2880 {decoder}"] = mb.panel_ns("dequant", decoder, 2880, 0, 0)
    if cpu.amx.usable:
        for k in (2048, 768, 2880):
            for rows in (8, 16, 32):
                for n in (32, 64, 128):
                    panel[f"brgemm k{k} rows{rows} n{n} (per 32 columns)"] = mb.brgemm_ns(k, rows, n) * 32 / n
    out["panel_ns"] = panel
    print("\n| one thread, panel in cache | ns per K x 32 panel |\n| --- | --- |")
    for name, ns in panel.items():
        print(f"| {name} | {ns:.0f} |")

    buf = torch.empty(args.stream_mib << 20, dtype=torch.uint8)
    buf.view(torch.int64).fill_(0x3C4D5E6F1A2B3C4D)
    stream = {"plain read": max(mb.read_gbps(buf) for _ in range(3))}
    for decoder in ("previous", "shipped"):
        for pf in (0, 16, 32, 64, 128):
            runs = [mb.stream_gbps(buf, decoder, pf, 1, 2048) for _ in range(2)]
            stream[f"{decoder} pf{pf} rows1"] = max(runs)
    for decoder in ("previous", "shipped"):
        for rows in (2, 4):
            for pf in (0, 32):
                stream[f"{decoder} pf{pf} rows{rows}"] = mb.stream_gbps(buf, decoder, pf, rows, 2048)
    for decoder in ("mxfp4_previous", "mxfp4_shipped"):
        for pf in (0, 16, 32, 64):
            stream[f"k2880 {decoder} pf{pf} rows1"] = mb.stream_gbps(buf, decoder, pf, 1, 2880)
    out["stream_gbps"] = stream
    print(f"\n| {torch.get_num_threads()} threads, {args.stream_mib} MiB of K=2048 fp8 panels | GB/s |\n"
          "| --- | --- |")
    for name, gbps in stream.items():
        print(f"| {name} | {gbps:.1f} |")

    regions = {}
    for threads in (args.threads, 1):
        torch.set_num_threads(threads)
        mb.region_us(200)
        regions[threads] = min(mb.region_us(1000) for _ in range(3))
    torch.set_num_threads(args.threads)
    out["region_us"] = regions
    out["layer_ms"] = layer_scaling(args.threads)
    print(f"\nempty parallel region: {', '.join(f'{t} threads {us:.2f} us' for t, us in regions.items())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
