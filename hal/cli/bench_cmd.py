"""`hal bench moe|requant|suite`: time kernels side by side with their baselines on this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs

from hal.cli import spec_args
from hal.cli.spec_args import int_list, str_list

DEFAULT_TOKENS = "1,4,16,64,256,1024"


def add_parser(sub):
    p = sub.add_parser("bench", help="time the selected kernel against baselines and other backends")
    modes = p.add_subparsers(dest="mode", required=True)

    moe = modes.add_parser("moe", help="an MoE layer over token counts and routings")
    spec_args.add(moe)
    moe.add_argument("--tokens", type=int_list, default=int_list(DEFAULT_TOKENS))
    moe.add_argument("--routing", type=str_list, default=["uniform"],
                     help="comma list of uniform, concentrated, one_expert")
    moe.add_argument("--backend", help="bench this backend as the main kernel (default: the selected)")
    moe.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads)")
    moe.add_argument("--no-reference", action="store_true", help="skip the torch reference (slow)")
    moe.add_argument("--only", action="store_true",
                     help="time only the main kernel, its baselines and the reference, not the "
                          "other backends that accept the spec")
    moe.add_argument("--plot", metavar="FILE.png",
                     help="also draw time against tokens for every variant and the roofline "
                          "(needs matplotlib: pip install 'moe-hal[plot]')")
    _common(moe)
    moe.set_defaults(run=run_moe)

    req = modes.add_parser("requant", help="FP8 per-token-group -> per-tensor requant, masked layout")
    req.add_argument("--hidden", type=int_list, default=int_list("7168,3584"))
    req.add_argument("--experts", type=int_list, default=int_list("8,32,56,128,256,512"))
    req.add_argument("--rows", type=int_list, default=int_list("1,8,32,128"), help="rows per expert")
    req.add_argument("--skew", type=int_list, default=int_list("1,4,16"),
                     help="the hot expert takes skew x rows; the total stays constant")
    req.add_argument("--backend")
    req.add_argument("--min-max-m", type=int, default=0,
                     help="allocate at least this many rows per expert, as DeepEP's fixed buffer does")
    _common(req, default_device="cuda")
    req.set_defaults(run=run_requant)

    suite = modes.add_parser("suite", help="a named suite of moe/requant runs, JSON and markdown per run")
    suite.add_argument("name", nargs="?", help="the suite (--list shows them)")
    suite.add_argument("--list", action="store_true", help="list the suites and what each runs")
    suite.add_argument("--device", help="run every entry on this device (default: the suite's)")
    suite.add_argument("--iters", type=int, help="override every entry's --iters")
    suite.add_argument("--out", default="bench-results", help="folder for <suite>/<entry>.json|.md")
    suite.set_defaults(run=run_suite)


def _common(p, default_device="cpu"):
    p.add_argument("--device", default=default_device, help="cpu | cuda | cuda:N")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown (for docs/)")
    p.add_argument("--out", help="also write the JSON results to this file")


def _payload(result, command: str) -> dict:
    payload = attrs.asdict(result, value_serializer=lambda _, __, v: str(v) if hasattr(v, "dtype") else v)
    payload["command"] = command
    return payload


def _emit(args, result, format_table) -> int:
    payload = _payload(result, "hal " + " ".join(sys.argv[1:]))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(payload, handle, indent=2, default=str)
    print(json.dumps(payload, indent=2, default=str) if args.json else format_table(result, args.markdown))
    return 0


def run_moe(args) -> int:
    from hal.bench import moe

    if args.plot:
        from hal.bench.plot import require_matplotlib

        require_matplotlib()
    result = _bench_moe(args)
    code = _emit(args, result, moe.format_table)
    if args.plot:
        from hal.bench.plot import plot_moe

        plot_moe(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return code


def run_requant(args) -> int:
    from hal.bench import requant

    return _emit(args, _bench_requant(args), requant.format_table)


def run_suite(args) -> int:
    from hal.bench import suites
    from hal.cli.main import parser
    from hal.devices import require_device
    from hal.registry import normalize_device

    if args.list or not args.name:
        for s in suites.SUITES.values():
            print(f"{s.name:<12} {s.device:<5} {s.about}")
            for label, argv in s.entries:
                print(f"    {label:<16} hal bench {' '.join(argv)}")
        return 0
    suite = suites.get(args.name)
    device = args.device or suite.device
    require_device(normalize_device(device))
    folder = Path(args.out) / suite.name
    folder.mkdir(parents=True, exist_ok=True)
    sections = [f"# hal bench suite {suite.name}", "", suite.about, ""]
    for label, argv in suite.entries:
        argv = ["bench", *argv, "--device", device] + (["--iters", str(args.iters)] if args.iters else [])
        entry = parser().parse_args(argv)
        command = "hal " + " ".join(argv)
        print(f"[hal bench] {suite.name}/{label}: {command}", file=sys.stderr, flush=True)
        if entry.mode == "moe":
            from hal.bench.moe import format_table
            result = _bench_moe(entry)
        else:
            from hal.bench.requant import format_table
            result = _bench_requant(entry)
        (folder / f"{label}.json").write_text(json.dumps(_payload(result, command), indent=2, default=str))
        table = format_table(result, markdown=True)
        (folder / f"{label}.md").write_text(table + "\n")
        sections += [f"## {label}", "", f"`{command}`", "", table, ""]
    (folder / "README.md").write_text("\n".join(sections))
    print(f"{suite.name}: {len(suite.entries)} runs, JSON and markdown in {folder}")
    return 0


def _bench_moe(args):
    import hal
    from hal.bench import moe
    from hal.devices import require_device
    from hal.registry import normalize_device

    for routing in args.routing:
        if routing not in ("uniform", "concentrated", "one_expert"):
            raise ValueError(f"--routing {routing!r}: expected uniform, concentrated or one_expert")
    spec = spec_args.spec_from(args)
    if spec.layout != "tokens":
        raise ValueError("hal bench moe times the token layout; w4afp8 (masked) runs under "
                         "`hal bench requant` for its requant stage")
    device = normalize_device(args.device)
    require_device(device)
    caps = hal.probe(deep=device != "cpu")
    return moe.run(spec, device, caps, args.tokens, args.routing, backend=args.backend,
                   threads=args.threads, warmup=args.warmup, iters=args.iters,
                   include_reference=not args.no_reference, include_others=not args.only)


def _bench_requant(args):
    import hal
    from hal.bench import requant
    from hal.devices import require_device
    from hal.registry import normalize_device

    device = normalize_device(args.device)
    require_device(device)
    caps = hal.probe(deep=device != "cpu")
    return requant.run(device, caps, args.hidden, args.experts, args.rows, args.skew,
                       backend=args.backend, min_max_m=args.min_max_m, warmup=args.warmup,
                       iters=args.iters)
