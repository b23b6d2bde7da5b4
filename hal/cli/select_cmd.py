"""`hal select`: the decision trace for one layer, and the kernel's per-call plan at N tokens."""

from __future__ import annotations

import json
import sys

from hal.cli import spec_args
from hal.ops import OPS

ROUTINGS = ("uniform", "concentrated", "one_expert")


def add_parser(sub):
    p = sub.add_parser("select", help="which backend runs a layer here, why, and its per-call plan")
    spec_args.add(p)
    p.add_argument("--tokens", type=int, required=True, help="tokens in the batch")
    p.add_argument("--routing", choices=ROUTINGS, default="uniform")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--profile", help="decide for a recorded profile instead of this machine")
    p.add_argument("--prefer", help="force a backend, as the op's override variable does ("
                                    + ", ".join(f"{op.override_variable} for {op.name}" for op in OPS) + ")")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    import attrs

    import hal
    from hal.registry import normalize_device

    if args.tokens < 0:
        raise ValueError(f"--tokens={args.tokens}: expected >= 0")
    spec = spec_args.spec_from(args)
    device = normalize_device(args.device)
    caps = hal.probe(deep=device != "cpu" and not args.profile, profile=args.profile)
    try:
        kernel = hal.select_kernel(spec, device, caps=caps, prefer=args.prefer)
    except hal.NoKernelError as exc:
        print(json.dumps(exc.decision.to_dict(), indent=2) if args.json else str(exc))
        return 1
    try:  # the op's template says what a batch of N tokens is for its plan()
        plan = kernel.plan(**kernel.plan_inputs(args.tokens, args.routing))
        plan_text, plan_dict = plan.describe(), attrs.asdict(plan)
    except Exception as exc:  # a plan that needs this hardware cannot be shown for a profile
        plan_text, plan_dict = f"plan unavailable here: {type(exc).__name__}: {exc}", None
    if args.json:
        print(json.dumps({"decision": kernel.decision.to_dict(), "tokens": args.tokens,
                          "routing": args.routing, "plan": plan_dict}, indent=2, default=str))
        return 0
    print(kernel.decision.explain())
    print(f"\nplan at {args.tokens} tokens ({args.routing} routing):")
    print(plan_text)
    sys.stdout.flush()
    return 0
