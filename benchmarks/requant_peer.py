"""The requant side by side with SGLang's Triton requant (`fp8_per_token_to_per_tensor_quant_triton`,
the W4AFP8 DeepEP low-latency path, after its launch-geometry rework) and with the legacy launch, in
one process, on the same inputs: per-token-group FP8 [E, max_m, K] -> per-tensor FP8.

    python benchmarks/requant_peer.py [--peer FILE.py] [--hidden 4096,7168] [--experts 8,...,512]
        [--rows 1,...,512] [--patterns uniform,hot16,half_empty] [--expected given,none]
        [--candidates] [--alternatives] [--exactness N] [--iters 7] [--budget-s S] [--json FILE]
    TRITON_INTERPRET=1 python benchmarks/requant_peer.py --device cpu --hidden 1024 --experts 4
        --rows 1,3 (a check of the harness on CPU: the interpreter's figures mean nothing)

FILE.py holds SGLang's kernel and its launcher, `fp8_per_token_to_per_tensor_quant_triton(x, x_scale,
masked_m, output_scale, output, expected_rows=None)`, and its launch rule `requant_launch_geometry`
(reported next to ours). Without --peer only the tuned rule and the legacy launch are timed.

Points: K x local experts x rows per expert x a row pattern x whether the dispatcher's estimate is
passed. Patterns: `uniform` (every expert `rows`), `hot16` (one expert takes 16 x rows, the others
share what is left, the total stays E x rows), `half_empty` (every other expert takes 2 x rows, the
rest none). `max_m` is the largest expert's rows. The estimate is `(live rows + E) // E`, as DeepEP's
dispatcher reports it; `none` passes no estimate. Scales are column-major, as DeepEP emits them.

Timing: each side's calls, one per rotated input set, captured in one CUDA graph; input sets are
rotated until their live bytes pass 128 MB (twice an H200's L2, so HBM serves them), at most 2048
sets; samples alternate between the sides, each replaying its graph for at least 2 ms; medians.
Bytes: every side's first set is compared with hal.backends.reference's requant (the float contract,
one IEEE division) byte for byte, and rows at or beyond masked_m must keep their poison. The tuned
and explicit geometries must match exactly (the run fails otherwise); the peer's mismatches are
counted and reported.

--candidates also times explicit geometries (m-grid 1-32, the rule's row cap and none, both tile
widths) at every point; --alternatives the rule's geometry with its cache hints and its row pairing
the other way: the data behind the rule in backends/requant/tuning.py. --exactness N compares the
bytes of both sides with the reference at N output scales before the sweep."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time

import attrs
import torch
from hal.backends.reference.ops import requant_fp8
from hal.backends.requant import tuning
from hal.backends.requant.geometry import RequantGeometry, pow2_floor, requant_launch_geometry
from hal.backends.requant.op import fp8_per_token_to_per_tensor

from hal.bench.interleaved import time_sides
from hal.bench.ratios import geomean
from hal.bench.requant import skewed_rows
from hal.synth import random_masked_inputs
from hal.testing.poison import is_poison

ROTATE_BYTES = 128 << 20  # live bytes over the rotated sets: twice an H200's L2
MAX_SETS = 2048  # launches per captured graph
POOL_BYTES = 4 << 30  # fp8 bytes of all input sets of one point, at most (more: one set)
MAX_SET_BYTES = 4 << 30  # one input set above this is skipped
# The peer indexes x with int32 products (expert * max_m * K): payloads of 2**31 elements or more
# would be read and written out of bounds, so the peer is not run there.
PEER_MAX_ELEMENTS = 2**31
MIN_SAMPLE_S = 0.002
OUTPUT_SCALE = 0.05
HOT_SKEW = 16
PATTERNS = ("uniform", "hot16", "half_empty")
M_GRIDS = (1, 2, 4, 8, 16, 32)


def rows_of(pattern: str, experts: int, rows: int) -> list:
    if pattern == "uniform":
        return [rows] * experts
    if pattern == "hot16":
        return skewed_rows(experts, rows, HOT_SKEW)
    if pattern == "half_empty":
        return [2 * rows if e % 2 == 0 else 0 for e in range(experts)]
    raise ValueError(f"pattern={pattern!r} is not allowed: expected one of {', '.join(PATTERNS)}")


def load_peer(path: str):
    spec = importlib.util.spec_from_file_location("requant_peer_kernel", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"--peer {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "fp8_per_token_to_per_tensor_quant_triton"):
        raise ValueError(f"--peer {path}: defines no fp8_per_token_to_per_tensor_quant_triton")
    return module


def input_sets(hidden: int, masked: list, device: str):
    """Rotated input sets of one point, made in one pool on the device: [(x, x_scale, masked_m)],
    max_m, live bytes per set; None when one set is over MAX_SET_BYTES."""
    experts, max_m = len(masked), max(max(masked), 1)
    groups = hidden // tuning.GROUP_SIZE
    live = sum(masked) * (2 * hidden + 4 * groups)
    one_set = experts * max_m * hidden
    if one_set > MAX_SET_BYTES:
        return None
    count = 1 if device == "cpu" else max(1, min(MAX_SETS, -(-ROTATE_BYTES // max(live, 1)),
                                                 POOL_BYTES // one_set))
    x, scale, masked_m = random_masked_inputs(count * experts, hidden, max_m, masked * count,
                                              seed=experts * 7919 + hidden + max_m, device=device)
    sets = [(x[i * experts:(i + 1) * experts], scale[i * experts:(i + 1) * experts],
             masked_m[i * experts:(i + 1) * experts]) for i in range(count)]
    return sets, max_m, live


def poisoned_like(x):
    return torch.full(x.shape, float("nan"), device=x.device).to(x.dtype)


def byte_errors(out, ref, masked_m) -> int:
    """Live bytes that differ from the reference, plus bytes at or beyond masked_m that lost their
    poison."""
    live = (torch.arange(out.shape[1], device=out.device)[None, :] < masked_m[:, None])[..., None]
    wrong = (out.view(torch.uint8) != ref.view(torch.uint8)) & live
    return int(wrong.sum()) + int((~is_poison(out) & ~live).sum())


def candidate_geometries(num_groups: int, experts: int, expected, max_m: int, rule,
                         peer_rule) -> dict:
    """Explicit geometries worth timing at a point, by name: every m-grid up to the rows an expert
    can hold (rounded up to a power of two), with the rule's row cap and without one, on the
    rule's tile; the other tile widths at the rule's m-grid; the peer's tile and m-grid."""
    found = {}
    if peer_rule is not None:
        found[(peer_rule[0], peer_rule[1], max_m)] = True
    widths = {rule.g_block, min(rule.g_block * 2, pow2_floor(num_groups))}
    caps = {max_m}
    if expected is not None:
        caps.add(min(max(tuning.ROW_CAP_SLACK * expected, 1), max_m))
    for m in M_GRIDS:
        if m > 1 and m // 2 >= max_m:
            break
        for cap in caps:
            found[(rule.g_block, m, max(min(cap, max_m), min(m, max_m)))] = True
    for g in widths:
        found[(g, rule.m_grid, min(rule.row_cap, max_m))] = True
    return {f"g{g} m{m} cap{cap}": RequantGeometry(g, m, cap, rule.streaming, rule.paired)
            for g, m, cap in found}


def alternatives(rule) -> dict:
    """The rule's geometry with its cache hints, its row pairing or both the other way."""
    found = {}
    for streaming, paired in ((not rule.streaming, rule.paired), (rule.streaming, not rule.paired),
                              (not rule.streaming, not rule.paired)):
        found[f"rule s{int(streaming)} p{int(paired)}"] = attrs.evolve(rule, streaming=streaming,
                                                                     paired=paired)
    return found


def run_point(hidden, experts, rows, pattern, expected_mode, peer, candidates, others, iters,
              device):
    masked = rows_of(pattern, experts, rows)
    made = input_sets(hidden, masked, device)
    if made is None:
        return None
    sets, max_m, live = made
    expected = (sum(masked) + experts) // experts if expected_mode == "given" else None
    groups = hidden // tuning.GROUP_SIZE
    scale = torch.tensor([OUTPUT_SCALE], device=device)
    rule = requant_launch_geometry(groups, experts, tuning.GROUP_SIZE, expected, 32, max_m)
    x0, s0, m0 = sets[0]
    ref = requant_fp8(x0, s0, m0, scale, poisoned_like(x0))

    def ours(geometry):
        return lambda s, o: fp8_per_token_to_per_tensor(s[0], s[1], s[2], scale, out=o,
                                                       expected_rows=expected, geometry=geometry,
                                                       check=False)

    launches = {"tuned": ours("tuned"), "legacy": ours("legacy")}
    if peer is not None and experts * max_m * hidden < PEER_MAX_ELEMENTS:
        launches["peer"] = lambda s, o: peer.fp8_per_token_to_per_tensor_quant_triton(
            s[0], s[1], s[2], scale, o, expected_rows=expected)
    peer_rule = None
    if peer is not None and hasattr(peer, "requant_launch_geometry"):
        peer_rule = list(peer.requant_launch_geometry(groups, experts, tuning.GROUP_SIZE, expected))
    if candidates:
        for name, geometry in candidate_geometries(groups, experts, expected, max_m, rule,
                                                   peer_rule).items():
            launches[name] = ours(geometry)
    if others:
        for name, geometry in alternatives(rule).items():
            launches[name] = ours(geometry)
    # One output per set, shared by the sides; each side's bytes are checked on a fresh poison.
    outs = [poisoned_like(s[0]) for s in sets]
    sides = {name: [lambda f=f, s=s, o=o: f(s, o) for s, o in zip(sets, outs, strict=True)]
             for name, f in launches.items()}
    seconds = time_sides(sides, iters, device, MIN_SAMPLE_S)
    errors = {}
    for name, f in launches.items():
        outs[0].fill_(float("nan"))
        f(sets[0], outs[0])
        errors[name] = byte_errors(outs[0], ref, m0)
    return dict(hidden=hidden, experts=experts, rows=rows, pattern=pattern, expected=expected,
                max_m=max_m, sets=len(sets), live_bytes=live, rule=list(rule),
                streaming=rule.streaming, paired=rule.paired, peer_rule=peer_rule,
                us={name: s * 1e6 for name, s in seconds.items()}, byte_errors=errors,
                elements=sum(masked) * hidden)


def summarize(points: list, baseline: str) -> str:
    ratios = [(p["us"][baseline] / p["us"]["tuned"], p) for p in points if baseline in p["us"]]
    if not ratios:
        return f"# no {baseline} timings"
    low = min(ratios, key=lambda r: r[0])
    p = low[1]
    return (f"# tuned vs {baseline}: geomean {geomean([r for r, _ in ratios]):.3f}x over {len(ratios)} "
            f"points, {sum(r < 1.0 for r, _ in ratios)} below 1.0, minimum {low[0]:.3f}x (K {p['hidden']}, "
            f"{p['experts']} experts x {p['rows']} rows, {p['pattern']}, expected {p['expected']}: "
            f"{p['us']['tuned']:.2f} vs {p['us'][baseline]:.2f} us)")


def ints(text: str) -> list:
    return [int(v) for v in text.split(",")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", default=None, help="SGLang's requant kernel and launcher, a .py file")
    parser.add_argument("--hidden", type=ints, default=[7168, 4096])
    parser.add_argument("--experts", type=ints, default=[8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--rows", type=ints, default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--expected", default="given,none", help="given, none or both")
    parser.add_argument("--candidates", action="store_true", help="also time explicit geometries")
    parser.add_argument("--alternatives", action="store_true",
                        help="also time the rule's geometry with its cache hints and row pairing flipped")
    parser.add_argument("--exactness", type=int, default=0, metavar="N",
                        help="first compare the bytes at N output scales in [0.005, 0.05] (8 experts x "
                             "64 rows x 7168) with the reference, ours and the peer's")
    parser.add_argument("--iters", type=int, default=7)
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="start no new point after this many seconds")
    parser.add_argument("--json", default=None, help="append one JSON line per point here")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    patterns = args.patterns.split(",")
    for pattern in patterns:
        rows_of(pattern, 2, 1)
    modes = args.expected.split(",")
    if not set(modes) <= {"given", "none"}:
        raise ValueError(f"--expected {args.expected!r}: expected given, none or both")
    if args.device != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA GPU here")
    import triton

    peer = load_peer(args.peer) if args.peer else None
    deadline = time.monotonic() + args.budget_s
    name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name()
    print(f"# {name}, torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; peer: {args.peer or 'none'}", flush=True)
    print("# K E rows pattern expected max_m | tuned [g m cap] | peer [g m] | legacy | peer/tuned "
          "legacy/tuned | byte errors", flush=True)
    if args.device == "cpu":  # the interpreter's own fp32 -> fp8 rounding is not the GPU's
        from hal.testing.triton_interpreter import fp8_casts_through_torch

        with fp8_casts_through_torch():
            return sweep(args, patterns, modes, peer, deadline)
    return sweep(args, patterns, modes, peer, deadline)


def exactness(peer, count: int, device: str) -> None:
    """Bytes against the reference over output scales log-spaced in [0.005, 0.05]."""
    experts, rows, hidden = 8, 64, 7168
    x, x_scale, masked_m = random_masked_inputs(experts, hidden, rows, [rows] * experts, seed=5,
                                                device=device)
    sides = {"tuned": lambda s, o: fp8_per_token_to_per_tensor(x, x_scale, masked_m, s, out=o,
                                                               expected_rows=rows + 1)}
    if peer is not None:
        sides["peer"] = lambda s, o: peer.fp8_per_token_to_per_tensor_quant_triton(
            x, x_scale, masked_m, s, o, expected_rows=rows + 1)
    off = {name: [0, 0] for name in sides}  # scales with any byte off, bytes off
    for i in range(count):
        value = 0.005 * 10 ** (i / max(count - 1, 1))
        scale = torch.tensor([value], device=device)
        ref = requant_fp8(x, x_scale, masked_m, scale, poisoned_like(x))
        for name, side in sides.items():
            out = poisoned_like(x)
            side(scale, out)
            bad = byte_errors(out, ref, masked_m)
            off[name][0] += bad > 0
            off[name][1] += bad
    for name, (scales, wrong) in off.items():
        print(f"# exactness {name}: {scales} of {count} output scales in [0.005, 0.05] off the "
              f"reference, {wrong} of {count * experts * rows * hidden} bytes", flush=True)


def sweep(args, patterns, modes, peer, deadline) -> int:
    if args.exactness:
        exactness(peer, args.exactness, args.device)
    sink = open(args.json, "a") if args.json else None
    points, failed = [], False
    for hidden in args.hidden:
        for mode in modes:
            for experts in args.experts:
                for rows in args.rows:
                    for pattern in patterns:
                        if time.monotonic() > deadline:
                            print("# time budget spent: the remaining points were not run", flush=True)
                            return finish(points, peer, sink, failed)
                        p = run_point(hidden, experts, rows, pattern, mode, peer, args.candidates,
                                      args.alternatives, args.iters, args.device)
                        if p is None:
                            print(f"# skip K {hidden} E {experts} rows {rows} {pattern}: one input set "
                                  f"over {MAX_SET_BYTES >> 30} GiB", flush=True)
                            continue
                        points.append(p)
                        ours_bad = {k: v for k, v in p["byte_errors"].items() if k != "peer" and v}
                        failed |= bool(ours_bad)
                        us = p["us"]
                        print(f"{hidden} {experts} {rows} {pattern} {p['expected']} {p['max_m']} | "
                              f"{us['tuned']:.2f} {p['rule']} | {us.get('peer', float('nan')):.2f} "
                              f"{p['peer_rule']} | {us['legacy']:.2f} | "
                              f"{us.get('peer', float('nan')) / us['tuned']:.3f} "
                              f"{us['legacy'] / us['tuned']:.3f} | {p['byte_errors'].get('peer', '-')}"
                              + (f" OURS WRONG: {ours_bad}" if ours_bad else ""), flush=True)
                        if sink:
                            sink.write(json.dumps(p) + "\n")
                            sink.flush()
    return finish(points, peer, sink, failed)


def finish(points, peer, sink, failed) -> int:
    if sink:
        sink.close()
    if peer is not None:
        print(summarize(points, "peer"), flush=True)
        wrong = [p for p in points if p["byte_errors"].get("peer")]
        print(f"# peer bytes differ from the reference at {len(wrong)} of {len(points)} points", flush=True)
    print(summarize(points, "legacy"), flush=True)
    if failed:
        print("# FAILED: a moe-hal launch wrote other bytes than the reference", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
