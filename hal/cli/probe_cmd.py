"""`hal probe`: what this machine (or a recorded profile) can do, and which kernel each model
preset would get here."""

from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("probe", help="show hardware capabilities and the kernel each preset gets")
    p.add_argument("--json", action="store_true",
                   help="print the capabilities as JSON (loadable again with HAL_CAPS=file.json)")
    p.add_argument("--deep", action="store_true",
                   help="also ask torch/Triton (creates a GPU context): opt-in shared memory, "
                        "registers, warp size, SM count")
    p.add_argument("--profile", help="show a recorded profile instead of this machine (hal profiles)")
    p.add_argument("--bandwidth", action="store_true",
                   help="also measure host memory bandwidth (a few seconds)")
    p.set_defaults(run=run)


def run(args) -> int:
    import hal
    from hal.matrix import format_matrix, selection_matrix
    from hal.probe.table import format_caps

    caps = hal.probe(deep=args.deep, profile=args.profile)
    if args.bandwidth:
        from hal.probe import with_measured_bandwidth

        caps = with_measured_bandwidth(caps)
    if args.json:
        print(caps.to_json())
        return 0
    print(format_caps(caps))
    print()
    print("Kernel per model preset (hal select --model NAME --tokens N for the per-call plan):")
    print(format_matrix(selection_matrix(caps)))
    return 0
