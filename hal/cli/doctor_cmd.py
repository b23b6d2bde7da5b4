"""`hal doctor`: what this installation can build and run, and what each missing piece costs."""

from __future__ import annotations

import json


def add_parser(sub):
    p = sub.add_parser("doctor", help="check torch, GPUs, compilers, Triton, the kernel cache and AMX")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    import platform

    import attrs

    import hal
    from hal.doctor import checks

    found = checks()
    blocking = [c.name for c in found if c.blocking]
    if args.json:
        print(json.dumps([{**attrs.asdict(c), "blocking": c.blocking} for c in found], indent=2))
        return 1 if blocking else 0
    print(f"moe-hal {hal.__version__}, Python {platform.python_version()}\n")
    width = max(len(c.name) for c in found)
    for c in found:
        mark = {True: "ok", None: "n/a", False: "FAIL" if c.essential else "no"}[c.ok]
        print(f"  {mark:<4}  {c.name:<{width}}  {c.detail}")
        if c.ok is False and c.cost:
            print(f"        {'':<{width}}  costs: {c.cost}")
    print()
    print(f"essential piece(s) missing: {', '.join(blocking)}" if blocking else
          "nothing essential is missing")
    return 1 if blocking else 0
