"""`hal select`: the decision trace for one layer, and the kernel's per-call plan at N tokens."""

from __future__ import annotations

import json
import sys

from hal.cli import spec_args
from hal.ops import OPS

ROUTINGS = ("uniform", "concentrated", "one_expert")
# A plan is for one batch: its routing tensors are allocated here, and no engine sends more tokens
# than this in one call.
MAX_TOKENS = 1 << 20


def add_parser(sub):
    p = sub.add_parser("select", help="which backend runs a layer here, why, and its per-call plan")
    spec_args.add(p)
    p.add_argument("--tokens", type=int, help="tokens in the batch: also print the kernel's plan for it")
    p.add_argument("--routing", choices=ROUTINGS, default="uniform")
    p.add_argument("--device", help="cpu | cuda | cuda:N (default: cpu, or a --profile's GPU)")
    p.add_argument("--profile", help="decide for a recorded profile instead of this machine")
    p.add_argument("--prefer", help="force a backend, as the op's override variable does ("
                                    + ", ".join(f"{op.override_variable} for {op.name}" for op in OPS) + ")")
    p.add_argument("--strict", action="store_true", default=None,
                   help="fail where only the reference oracle can run the layer (as HAL_STRICT=1)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    import attrs

    import hal
    from hal.devices import require_device
    from hal.registry import normalize_device

    if args.tokens is not None and not 0 <= args.tokens <= MAX_TOKENS:
        raise ValueError(f"--tokens={args.tokens}: expected 0 to {MAX_TOKENS} (one batch)")
    spec = spec_args.spec_from(args)
    caps = hal.probe(profile=args.profile) if args.profile else None
    device = normalize_device(args.device or _default_device(caps))
    if caps is None or caps.profile is None:
        caps = hal.probe(deep=device != "cpu")
    if caps.profile is None:
        require_device(device)
    try:
        kernel = hal.select_kernel(spec, device, caps=caps, prefer=args.prefer, strict=args.strict)
    except hal.NoKernelError as exc:
        if not args.json:
            raise
        print(json.dumps(exc.decision.to_dict(), indent=2))
        return 2
    plan_text = plan_dict = None
    if args.tokens is not None:
        try:  # the op's template says what a batch of N tokens is for its plan()
            plan = kernel.plan(**kernel.plan_inputs(args.tokens, args.routing))
            plan_text, plan_dict = plan.describe(), attrs.asdict(plan)
        except Exception as exc:  # a plan that needs this hardware cannot be shown for a profile
            plan_text = f"plan unavailable here: {type(exc).__name__}: {exc}"
    if args.json:
        payload = {"decision": kernel.decision.to_dict()}
        if args.tokens is not None:
            payload.update(tokens=args.tokens, routing=args.routing, plan=plan_dict)
        print(json.dumps(payload, indent=2, default=str))
        return 0
    print(kernel.decision.explain())
    if args.tokens is not None:
        print(f"\nplan at {args.tokens} tokens ({args.routing} routing):")
        print(plan_text)
    sys.stdout.flush()
    return 0


def _default_device(caps) -> str:
    """cpu, or the first GPU of a recorded profile that has one (said on stderr)."""
    if caps is None or not caps.gpus:
        return "cpu"
    gpu = caps.gpus[0]
    print(f"hal select: profile {caps.profile} has a GPU ({gpu.name or gpu.vendor}, {gpu.arch}): "
          f"deciding for cuda:{gpu.index} (--device cpu decides for its CPU)", file=sys.stderr)
    return f"cuda:{gpu.index}"
