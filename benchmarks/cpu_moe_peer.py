"""cpu_brgemm side by side with vLLM 0.33.0's CPU fused MoE (`fused_experts_cpu`, csrc/cpu/sgl-kernels).

    python benchmarks/cpu_moe_peer.py --peer PATH [--models qwen3-30b-a3b:fp8_block128,gpt-oss-20b:mxfp4]
        [--tokens 1,2,4,8,16,64,256,1024,3000] [--modes cold,warm] [--threads 16] [--json out.json]

PATH is a built library that registers `torch.ops.vllm_cpu_peer.{fused_experts_cpu,
convert_weight_packed, convert_scale_packed}` (the peer's entry points under a benchmark binding),
or a folder holding one. Without --peer only cpu_brgemm is timed.

Both kernels get the same checkpoint tensors (each packs them its own way, once), the same
activations and routings. Calls alternate between the two (the order flips every iteration), each
call on the next of --rotate input sets with their own uniform routing. `cold` writes --flush-mib
(default 1 GiB) of memory before every call, so the weights come from DRAM; `warm` does not (the
weights of the rotated sets stay wherever the previous calls left them). Each point reports the
median; ratio = peer median / cpu_brgemm median (above 1: cpu_brgemm is faster). The floor is the
call's weight bytes at the copy rate plus its FLOPs at the bf16 matmul rate, both measured in the
same run."""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import platform
import statistics
import time

import torch

import hal
from hal.bench.ratios import geomean
from hal.presets import PRESETS
from hal.spec import MoEWeights
from hal.synth import random_routing

PEER_FP8_W8A16 = 2  # vLLM's CPUQuantMethod
PEER_MXFP4 = 4
PEER_BF16 = 0
PEER_SILU = 0  # vLLM's CPUActMethod
PEER_SWIGLU = 1


def load_peer(path: str):
    """torch.ops.vllm_cpu_peer, from a built library or a folder holding one. The peer is built
    for AVX-512 with AMX (its static initializers already use AVX-512), so it is loaded only where
    the CPU has them."""
    isa = hal.probe().cpu.isa
    if not (isa.avx512 and isa.avx512_bf16 and hal.probe().cpu.amx.usable):
        raise ValueError(f"--peer {path!r}: the peer is built for AVX-512-BF16 and AMX, which this CPU "
                         "lacks (loading it would end the process with an illegal instruction)")
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "**", "vllm_cpu_peer*.so"), recursive=True))
        if not found:
            raise ValueError(f"--peer {path!r}: no vllm_cpu_peer*.so in that folder")
        path = found[0]
    torch.ops.load_library(path)
    return torch.ops.vllm_cpu_peer, path


def checkpoint_weights(spec, seed: int = 7) -> MoEWeights:
    """Random checkpoint tensors of the spec's format, drawn as raw bytes where the format allows
    (a full-size fp8 layer from torch.randn takes many seconds): every fp8 encoding but NaN, every
    e2m1 pair, e8m0 exponents a little under 127; scales keep the outputs O(1)."""
    g = torch.Generator().manual_seed(seed)
    E, H, I, R = spec.local_experts, spec.hidden_size, spec.intermediate_size, spec.w13_rows
    fmt = spec.weight_format

    def fp8(rows, cols):
        q = torch.randint(0, 256, (E, rows, cols), generator=g, dtype=torch.uint8)
        q[(q & 0x7F) == 0x7F] -= 1  # 0x7f / 0xff are e4m3fn's NaNs
        s = (torch.rand(E, math.ceil(rows / 128), math.ceil(cols / 128), generator=g) + 0.5)
        return q.view(torch.float8_e4m3fn), s / (128 * math.sqrt(cols))

    def mxfp4(rows, cols):
        q = torch.randint(0, 256, (E, rows, cols // 2), generator=g, dtype=torch.uint8)
        s = torch.randint(119, 123, (E, rows, cols // 32), generator=g, dtype=torch.uint8)
        return q, s

    extra = {}
    if fmt == "fp8_block128":
        (w13, s13), (w2, s2) = fp8(R, H), fp8(H, I)
    elif fmt == "mxfp4":
        (w13, s13), (w2, s2) = mxfp4(R, H), mxfp4(H, I)
    elif fmt == "bf16":
        w13 = (torch.randn(E, R, H, generator=g) / math.sqrt(H)).bfloat16()
        w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).bfloat16()
        s13 = s2 = None
    else:
        raise ValueError(f"format {fmt!r} is not benchmarked here: expected fp8_block128, mxfp4 or bf16")
    if spec.has_bias:
        extra = dict(b13=torch.randn(E, R, generator=g) * 0.1, b2=torch.randn(E, H, generator=g) * 0.1)
    return MoEWeights(w13=w13, w2=w2, w13_scale=s13, w2_scale=s2, **extra)


class PeerLayer:
    """One MoE layer through the peer: its packed weights and the call vLLM makes."""

    def __init__(self, ops, spec, weights: MoEWeights):
        self.ops, self.spec = ops, spec
        fmt = spec.weight_format
        self.w13 = ops.convert_weight_packed(weights.w13.contiguous())
        self.w2 = ops.convert_weight_packed(weights.w2.contiguous())
        self.s13 = self.s2 = None
        self.block = None
        if fmt == "fp8_block128":
            self.method = PEER_FP8_W8A16
            self.s13, self.s2 = weights.w13_scale.float().contiguous(), weights.w2_scale.float().contiguous()
            self.block = [128, 128]
        elif fmt == "mxfp4":
            self.method = PEER_MXFP4
            self.s13 = ops.convert_scale_packed(weights.w13_scale.contiguous())
            self.s2 = ops.convert_scale_packed(weights.w2_scale.contiguous())
        else:
            self.method = PEER_BF16
        if spec.activation == "silu":
            self.act, self.alpha, self.limit = PEER_SILU, None, None
        elif spec.activation == "swiglu_oai":
            self.act, self.alpha, self.limit = PEER_SWIGLU, float(spec.swiglu_alpha), float(spec.swiglu_limit)
        else:
            raise ValueError(f"activation {spec.activation!r} has no vLLM CPU kernel")
        self.b13 = None if weights.b13 is None else weights.b13.float().contiguous()
        self.b2 = None if weights.b2 is None else weights.b2.float().contiguous()

    def __call__(self, x, topk_weights, topk_ids, out):
        self.ops.fused_experts_cpu(out, x, self.w13, self.w2, topk_weights, topk_ids, self.method,
                                   self.s13, self.s2, None, None, None, self.block, self.b13, self.b2,
                                   self.alpha, self.limit, True, self.act)
        return out


def input_sets(spec, tokens: int, rotate: int):
    sets = []
    for i in range(rotate):
        g = torch.Generator().manual_seed(1000 + i)
        x = (torch.randn(tokens, spec.hidden_size, generator=g)).bfloat16()
        tw, ti = random_routing(spec, tokens, "uniform", seed=2000 + i)
        sets.append((x, tw, ti, torch.empty_like(x)))
    return sets


def touched_bytes_and_flops(spec, sets):
    per_expert = spec.weight_bytes_per_expert()
    touched = statistics.mean(int(ti.unique().numel()) for _, _, ti, _ in sets)
    routes = statistics.mean(int(ti.numel()) for _, _, ti, _ in sets)
    return touched * per_expert, routes * spec.flops_per_token()


def time_point(variants, sets, cold: bool, flush, warmup: int, iters: int, budget_s: float):
    """{name: [seconds]}: calls interleaved, the order flipped every iteration."""
    names = list(variants)
    samples = {n: [] for n in names}
    start = time.perf_counter()
    for it in range(warmup + iters):
        order = names if it % 2 == 0 else names[::-1]
        x, tw, ti, out = sets[it % len(sets)]
        for name in order:
            if cold:
                flush.fill_(it)
            t0 = time.perf_counter()
            variants[name](x, tw, ti, out)
            elapsed = time.perf_counter() - t0
            if it >= warmup:
                samples[name].append(elapsed)
        if it >= warmup + 2 and time.perf_counter() - start > budget_s:
            break
    return samples


def agreement(ours, peer, sets) -> float:
    """max |peer - ours| / max |ours| on the first input set."""
    x, tw, ti, _ = sets[0]
    a = ours(x, tw, ti, torch.empty_like(x)).float()
    b = peer(x, tw, ti, torch.empty_like(x)).float()
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))


GROUPS = (("decode T<=16", lambda t: t <= 16), ("prefill T>=64", lambda t: t >= 64))


def over_floor(seconds: float, floor_s) -> str:
    return f"{seconds / floor_s:.2f}" if floor_s and seconds == seconds else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer", default=None, help="built peer library (.so) or a folder holding one")
    parser.add_argument("--models", default="qwen3-30b-a3b:fp8_block128,gpt-oss-20b:mxfp4",
                        help="model:format pairs, comma-separated")
    parser.add_argument("--tokens", default="1,2,4,8,16,64,256,1024,3000")
    parser.add_argument("--modes", default="cold,warm")
    parser.add_argument("--experts", type=int, default=None, help="num_experts (the preset's, scaled down)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rotate", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--point-seconds", type=float, default=3.0,
                        help="stop a point's iterations after this long (at least 3 are kept)")
    parser.add_argument("--flush-mib", type=int, default=1024)
    parser.add_argument("--no-floor", action="store_true", help="skip measuring the copy and matmul rates")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    peer_ops, peer_path = load_peer(args.peer) if args.peer else (None, None)
    modes = args.modes.split(",")
    tokens = [int(t) for t in args.tokens.split(",")]
    flush = torch.empty(args.flush_mib << 18, dtype=torch.float32) if "cold" in modes else None
    ceilings = None
    if not args.no_floor:
        from hal.bench.ceilings import measure
        ceilings = measure("cpu")
    cpu = hal.probe().cpu
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                cpu=cpu.model_name, threads=torch.get_num_threads(), torch=torch.__version__,
                python=platform.python_version(), peer=peer_path,
                copy_gbps=ceilings and ceilings.copy_gbps, bf16_tflops=ceilings and ceilings.bf16_tflops,
                flush_mib=args.flush_mib, rotate=args.rotate)
    print(f"# {meta['cpu']}, {meta['threads']} threads, torch {meta['torch']}, Python {meta['python']}, "
          f"{meta['date']}")
    if ceilings:
        print(f"# {ceilings.describe()}")
    print(f"# peer: {peer_path or 'not loaded (--peer)'}")
    layers = []
    for pair in args.models.split(","):
        model, fmt = pair.split(":")
        spec = PRESETS[model].spec(fmt, **({"num_experts": args.experts} if args.experts else {}))
        t0 = time.perf_counter()
        weights = checkpoint_weights(spec)
        kernel = hal.select_moe_kernel(spec, "cpu", prefer="cpu_brgemm")
        prepared = kernel.prepare_weights(weights)

        def ours(x, tw, ti, out, kernel=kernel, prepared=prepared):
            return kernel(x, tw, ti, prepared, out=out, check=False)

        variants = {"cpu_brgemm": ours}
        print(f"# {model} {fmt}: {spec} (weights ready in {time.perf_counter() - t0:.1f} s)", flush=True)
        if peer_ops is not None:
            try:  # a peer that rejects this layer leaves the row to cpu_brgemm alone, and says why
                peer = PeerLayer(peer_ops, spec, weights)
                err = agreement(ours, peer, input_sets(spec, 4, 1))
                variants["peer"] = peer
                print(f"#   max |peer - cpu_brgemm| / max |cpu_brgemm| at 4 tokens: {err:.2e}")
            except RuntimeError as exc:
                print(f"#   the peer failed on this layer, timing cpu_brgemm alone: {exc}".splitlines()[0])
        del weights
        layers.append((model, fmt, spec, variants))
    print("\n| model | mode | tokens | cpu_brgemm us | peer us | ratio (peer/ours) | floor us | ours/floor | "
          "peer/floor | iters |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    rows = []
    for m in tokens:  # every model at one token count before the next, so a cut-short run has all models
        for model, fmt, spec, variants in layers:
            sets = input_sets(spec, m, args.rotate)
            nbytes, flops = touched_bytes_and_flops(spec, sets)
            floor_s = (nbytes / (ceilings.copy_gbps * 1e9) + flops / (ceilings.bf16_tflops * 1e12)) \
                if ceilings else None
            for mode in modes:
                samples = time_point(variants, sets, mode == "cold", flush, args.warmup, args.iters,
                                     args.point_seconds)
                med = {n: statistics.median(v) for n, v in samples.items()}
                ratio = med["peer"] / med["cpu_brgemm"] if "peer" in med else None
                row = dict(model=model, format=fmt, mode=mode, tokens=m, ours_us=med["cpu_brgemm"] * 1e6,
                           peer_us=med.get("peer", float("nan")) * 1e6, ratio=ratio,
                           floor_us=floor_s and floor_s * 1e6, iters=len(samples["cpu_brgemm"]),
                           weight_bytes=nbytes, flops=flops)
                rows.append(row)
                print(f"| {model} {fmt} | {mode} | {m} | {row['ours_us']:.0f} | {row['peer_us']:.0f} | "
                      f"{'-' if ratio is None else f'{ratio:.2f}'} | "
                      f"{'-' if floor_s is None else f'{floor_s * 1e6:.0f}'} | "
                      f"{over_floor(med['cpu_brgemm'], floor_s)} | "
                      f"{over_floor(med.get('peer', float('nan')), floor_s)} | {row['iters']} |", flush=True)
        if args.json:  # after every token count, so a cut-short run keeps what it measured
            with open(args.json, "w") as f:
                json.dump(dict(meta=meta, rows=rows), f, indent=1)
    if peer_ops is not None:
        print("\n| model | mode | group | geomean ratio | min ratio |")
        print("| --- | --- | --- | --- | --- |")
        for pair in args.models.split(","):
            model, fmt = pair.split(":")
            for mode in modes:
                for group, keep in GROUPS:
                    r = [row["ratio"] for row in rows if row["model"] == model and row["mode"] == mode
                         and keep(row["tokens"])]
                    if r:
                        print(f"| {model} {fmt} | {mode} | {group} | {geomean(r):.2f} | {min(r):.2f} |")


if __name__ == "__main__":
    main()
