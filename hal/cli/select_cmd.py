"""`hal select`: the decision trace for one layer, and the kernel's per-call plan at N tokens."""

from __future__ import annotations

import json
import sys

from hal.cli import spec_args

ROUTINGS = ("uniform", "concentrated", "one_expert")


def add_parser(sub):
    p = sub.add_parser("select", help="which backend runs a layer here, why, and its per-call plan")
    spec_args.add(p)
    p.add_argument("--tokens", type=int, required=True, help="tokens in the batch")
    p.add_argument("--routing", choices=ROUTINGS, default="uniform")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--profile", help="decide for a recorded profile instead of this machine")
    p.add_argument("--prefer", help="force a backend (as HAL_MOE_BACKEND does)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def masked_rows(spec, topk_ids):
    """Rows per local expert as DeepEP's dispatcher would deliver them, and the expected rows it
    reports: (total + E) // E."""
    import torch

    counts = torch.bincount(topk_ids.flatten().long() % spec.local_experts,
                            minlength=spec.local_experts).to(torch.int32)
    expected = (int(counts.sum()) + spec.local_experts) // spec.local_experts
    return counts, expected


def run(args) -> int:
    import attrs

    import hal
    from hal.registry import normalize_device
    from hal.synth import random_routing

    if args.tokens < 0:
        raise ValueError(f"--tokens={args.tokens}: expected >= 0")
    spec = spec_args.spec_from(args)
    device = normalize_device(args.device)
    caps = hal.probe(deep=device != "cpu" and not args.profile, profile=args.profile)
    try:
        kernel = hal.select_moe_kernel(spec, device, caps=caps, prefer=args.prefer)
    except hal.NoKernelError as exc:
        print(json.dumps(exc.decision.to_dict(), indent=2) if args.json else str(exc))
        return 1
    _, topk_ids = random_routing(spec, args.tokens, args.routing)
    try:
        if spec.layout == "masked":
            masked_m, expected = masked_rows(spec, topk_ids)
            plan = kernel.plan(masked_m=masked_m, expected_rows=expected)
        else:
            plan = kernel.plan(topk_ids)
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
