"""`hal build`: compile the JIT specializations this machine will use, before the first request
pays for them."""

from __future__ import annotations

from hal.cli import spec_args


def add_parser(sub):
    p = sub.add_parser("build", help="precompile kernels (default: every preset this machine runs)")
    spec_args.add(p, required=False)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.set_defaults(run=run)


def run(args) -> int:
    import hal
    from hal import presets
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
    done, failed, unbuilt = set(), 0, set()
    for spec in specs:
        try:
            kernel = hal.select_moe_kernel(spec, device, caps=caps)
        except hal.NoKernelError as exc:
            print(f"skip {spec.weight_format} {spec.hidden_size}x{spec.intermediate_size}: "
                  f"{str(exc).splitlines()[0]}")
            continue
        # Selection falls back past a backend whose build failed; building is this command's job,
        # so such a backend is a failure here, not a silent fallback.
        for candidate in kernel.decision.candidates:
            why = candidate.verdict.summary()
            if not candidate.verdict.ok and why.startswith("build failed") and candidate.name not in unbuilt:
                unbuilt.add(candidate.name)
                failed += 1
                print(f"FAILED {candidate.name}: {why}")
        try:
            built = kernel.compile()
        except Exception as exc:
            failed += 1
            print(f"FAILED {kernel.backend}: {exc}")
            continue
        for item in built:
            if item not in done:
                done.add(item)
                print(f"built {kernel.backend}: {item}")
    print(f"{len(done)} specializations ready, {failed} failed")
    return 1 if failed else 0
