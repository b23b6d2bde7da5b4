"""Time one expert-parallel MoE layer, split into dispatch / compute / combine, at several world
sizes on one host.

    python benchmarks/ep_layer.py                          # gloo on CPU: 1, 2 and 4 ranks
    python benchmarks/ep_layer.py --backend nccl --worlds 1 # NCCL, rank r on cuda:r

Ranks are processes on 127.0.0.1. On CPU the host's cores are split between the ranks
(torch.set_num_threads(cores // world), at least 1). The token count is the whole batch, split
evenly over the ranks, so every world size runs the same layer on the same number of routes.
Each step of one call is timed on every rank between host syncs; a row reports, per step, the
median over calls of the slowest rank, and the layer as the median of the slowest rank's sum.
The first row of each token count is the plain local kernel in one process (no group), the
baseline the expert-parallel layer is measured against."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import tempfile
import time

import attrs
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hal
from hal.presets import PRESETS
from hal.synth import random_routing, random_tokens, random_weights

STEPS = ("dispatch", "compute", "combine")


def layer_spec(args) -> hal.MoESpec:
    return PRESETS[args.model].spec(args.format, num_experts=args.experts)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _local_weights(spec, assignment, rank, device):
    """This rank's experts only (what a sharded checkpoint loader hands over), with their map."""
    count = assignment.local_count(rank)
    if count == spec.num_experts:
        return random_weights(spec, device=device, seed=rank)
    weights = random_weights(attrs.evolve(spec, num_local_experts=count), device=device, seed=rank)
    return attrs.evolve(weights, expert_map=assignment.expert_map(rank).to(device))


def _rank(rank, world, port, args, result_path):
    device = f"cuda:{rank}" if args.backend == "nccl" else "cpu"
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // world) if device == "cpu" else torch.get_num_threads()
    torch.set_num_threads(threads)
    if device != "cpu":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    spec = layer_spec(args)
    kernel = hal.select_moe_kernel(spec, device, prefer=args.local, group=dist.group.WORLD)
    prepared = kernel.prepare_weights(_local_weights(spec, kernel.comm.assignment, rank, device))
    tokens = args.tokens // world + (rank < args.tokens % world)
    x = random_tokens(spec, tokens, seed=100 + rank, device=device)
    tw, ti = random_routing(spec, tokens, mode=args.routing, seed=200 + rank, device=device)
    plan = kernel.plan(ti)
    samples = []
    for i in range(args.warmup + args.iters):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        d = kernel.dispatch(x, tw, ti, prepared)
        _sync(device)
        t1 = time.perf_counter()
        partial = kernel.compute(d, prepared)
        _sync(device)
        t2 = time.perf_counter()
        kernel.combine(d, partial)
        _sync(device)
        t3 = time.perf_counter()
        if i >= args.warmup:
            samples.append((t1 - t0, t2 - t1, t3 - t2))
    plain = None
    if world == 1:  # the same layer through the plain local kernel, no group
        single = hal.select_moe_kernel(spec, device, prefer=args.local)
        single_prepared = single.prepare_weights(random_weights(spec, device=device, seed=0))
        plain = []
        for i in range(args.warmup + args.iters):
            _sync(device)
            t0 = time.perf_counter()
            single(x, tw, ti, single_prepared)
            _sync(device)
            if i >= args.warmup:
                plain.append(time.perf_counter() - t0)
    everyone = [None] * world
    dist.all_gather_object(everyone, dict(samples=samples, plan=attrs.asdict(plan, recurse=False,
                                                                              filter=_plain_fields)))
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(dict(world=world, threads=threads, local=kernel.local.backend, ranks=everyone,
                           plain=plain, plain_backend=None if plain is None else single.backend), f)
    dist.destroy_process_group()


def _plain_fields(attribute, value):
    return attribute.name != "local"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _row(result, tokens):
    world = result["world"]
    per_call = [[max(r["samples"][i][s] for r in result["ranks"]) for s in range(3)]
                for i in range(len(result["ranks"][0]["samples"]))]
    layer = [max(sum(r["samples"][i]) for r in result["ranks"]) for i in range(len(per_call))]
    moved = sum(sum(r["plan"]["rows_sent"]) - r["plan"]["rows_sent"][k]
                for k, r in enumerate(result["ranks"]))
    rows = sum(sum(r["plan"]["rows_sent"]) for r in result["ranks"])
    ms = lambda v: f"{1e3 * statistics.median(v):.2f}"  # noqa: E731
    return (f"| {tokens} | {world} | ep:{result['local']} | {result['threads']} | "
            + " | ".join(ms([c[s] for c in per_call]) for s in range(3))
            + f" | {ms(layer)} | {rows} ({moved} to other ranks) |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--tokens", default="32,256", help="whole batch per layer call, comma-separated")
    parser.add_argument("--model", default="qwen3-30b-a3b", choices=sorted(PRESETS))
    parser.add_argument("--experts", type=int, default=32, help="num_experts (the preset's, scaled down)")
    parser.add_argument("--format", default="bf16")
    parser.add_argument("--local", default=None, help="force the local backend (prefer=)")
    parser.add_argument("--routing", default="uniform", choices=("uniform", "concentrated"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    spec = layer_spec(args)
    cpu = hal.probe().cpu
    print(f"{spec}\nCPU {cpu.model_name}, {len(os.sched_getaffinity(0))} usable cores; "
          f"torch {torch.__version__}, "
          f"Python {platform.python_version()}; {args.backend}, {args.routing} routing, median of "
          f"{args.iters} calls after {args.warmup} warmup\n")
    print("| tokens | ranks | kernel | threads/rank | dispatch ms | compute ms | combine ms | layer ms | "
          "(token, rank) rows |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for total in [int(t) for t in args.tokens.split(",")]:
        args.tokens = total
        for world in [int(w) for w in args.worlds.split(",")]:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "result.json")
                mp.spawn(_rank, args=(world, _free_port(), args, path), nprocs=world)
                with open(path) as f:
                    result = json.load(f)
            if result["plain"] is not None:
                median = 1e3 * statistics.median(result["plain"])
                print(f"| {total} | - | {result['plain_backend']} (no group) | {result['threads']} "
                      f"| - | - | - | {median:.2f} | - |", flush=True)
            print(_row(result, total), flush=True)


if __name__ == "__main__":
    main()
