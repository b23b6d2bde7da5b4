"""`hal probe`: what this machine (or a recorded profile) can do, and which kernel each model
preset would get here."""

from __future__ import annotations

import sys


def add_parser(sub):
    p = sub.add_parser("probe", help="show hardware capabilities and the kernel each preset gets")
    p.add_argument("--json", action="store_true",
                   help="print the capabilities and the preset table as JSON (loadable again with "
                        "HAL_CAPS=file.json)")
    p.add_argument("--deep", action="store_true",
                   help="also ask torch/Triton (creates a GPU context): opt-in shared memory, "
                        "registers, warp size, SM count")
    p.add_argument("--profile", help="show a recorded profile instead of this machine (hal profiles)")
    p.add_argument("--bandwidth", action="store_true",
                   help="also measure host memory bandwidth (a few seconds)")
    p.add_argument("--strict", action="store_true", default=None,
                   help="exit 1 where a preset gets only the reference oracle (as HAL_STRICT=1)")
    p.set_defaults(run=run)


def run(args) -> int:
    import json

    import attrs

    import hal
    from hal.caps import SELECTION_KEY
    from hal.matrix import format_matrix, selection_matrix
    from hal.probe.table import format_caps
    from hal.registry import strict_from_env

    strict = strict_from_env() if args.strict is None else args.strict
    caps = hal.probe(deep=args.deep, profile=args.profile)
    if args.bandwidth:
        from hal.probe import with_measured_bandwidth

        caps = with_measured_bandwidth(caps)
    rows = selection_matrix(caps)
    if args.json:
        print(json.dumps({**attrs.asdict(caps), SELECTION_KEY: [attrs.asdict(r) for r in rows]}, indent=2))
    else:
        print(format_caps(caps))
        if not args.profile:
            _print_missing_packages()
        print()
        print("Kernel per model preset (hal select --model NAME --tokens N for the per-call plan):")
        print(format_matrix(rows))
    slow = sum(r.slow for r in rows)
    if slow and strict:
        print(f"hal probe: {slow} preset layer(s) get only the reference oracle here (slow), and strict "
              "mode refuses it", file=sys.stderr)
        return 1
    return 0


def _print_missing_packages() -> None:
    from hal.backend import missing_packages
    from hal.registry import discover

    for package, names in missing_packages(f.backend for f in discover() if f.backend).items():
        print(f"  {package} is not installed: {', '.join(sorted(names))} cannot run here "
              f"(pip install {package}; CUDA and ROCm builds of torch bring triton with them)")
