"""`hal build`: compile the JIT specializations this machine will use, before the first request
pays for them. Progress goes one line per layer spec ([i/N]); the summary (or, with --json, one
JSON object on stdout, the progress then on stderr) says what was built, skipped and failed."""

from __future__ import annotations

import json
import sys
import time

from hal.cli import spec_args


def add_parser(sub):
    p = sub.add_parser("build", help="precompile kernels (default: every preset this machine runs)")
    spec_args.add(p, required=False)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    p.set_defaults(run=run)


def run(args) -> int:
    import hal
    from hal import jit, presets
    from hal.devices import require_device
    from hal.registry import normalize_device

    device = normalize_device(args.device)
    caps = hal.probe(deep=device != "cpu")
    if caps.profile is None:
        require_device(device)
    if args.model or args.experts:
        specs = [spec_args.spec_from(args)]
    else:
        specs = [p.spec(fmt) for p in presets.PRESETS.values() for fmt in p.formats]
    out = sys.stderr if args.json else sys.stdout
    built, skipped, failed, unbuilt = [], [], [], set()
    started = time.monotonic()
    for i, spec in enumerate(specs, 1):
        layer = f"{spec.weight_format} {spec.hidden_size}x{spec.intermediate_size}"
        step = f"[{i}/{len(specs)}] {layer}"
        try:
            kernel = hal.select_moe_kernel(spec, device, caps=caps)
        except hal.NoKernelError as exc:
            skipped.append({"spec": layer, "reason": str(exc).splitlines()[0]})
            print(f"{step}: skip: {skipped[-1]['reason']}", file=out, flush=True)
            continue
        print(f"{step}: {kernel.backend}", file=out, flush=True)
        # Selection falls back past a backend whose build failed; building is this command's job,
        # so such a backend is a failure here, not a silent fallback.
        for candidate in kernel.decision.candidates:
            why = candidate.verdict.summary()
            if not candidate.verdict.ok and why.startswith("build failed") and candidate.name not in unbuilt:
                unbuilt.add(candidate.name)
                failed.append({"backend": candidate.name, "spec": layer, "error": why})
                print(f"FAILED {candidate.name}: {why}", file=out, flush=True)
        try:
            items = kernel.compile()
        except Exception as exc:
            failed.append({"backend": kernel.backend, "spec": layer, "error": str(exc)})
            print(f"FAILED {kernel.backend}: {exc}", file=out, flush=True)
            continue
        for item in items:
            if all(b["specialization"] != item for b in built):
                built.append({"backend": kernel.backend, "specialization": item})
                print(f"built {kernel.backend}: {item}", file=out, flush=True)
    seconds = time.monotonic() - started
    if args.json:
        print(json.dumps({"cache": str(jit.cache_dir()), "specs": len(specs), "built": built,
                          "skipped": skipped, "failed": failed, "seconds": round(seconds, 1)}, indent=2))
    else:
        print(f"{len(built)} specializations ready in {jit.cache_dir()}, {len(skipped)} specs skipped, "
              f"{len(failed)} failed ({seconds:.0f} s)")
    return 1 if failed else 0
