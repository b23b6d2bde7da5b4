"""Calls that may end the process (an out-of-range id with check=False) run in a child Python, so a
crash fails the one case that crashed instead of killing the test run. One child runs every case
of a backend and device; after a crash the next child resumes after the crashed case.

    python -m hal.testing.isolated '{"backend": ..., "device": ..., "specs": {id: {...}}}'

prints {"start": id} before each case and {"done": id, "error": "..."} after it."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import attrs

from hal.testing.cases import MOE_SPECS, SPECS, isolated_spec


def unchecked_out_of_range_error(case, timeout: float = 600.0) -> str:
    """'' when the case held in the child, else why not."""
    ids = tuple(k for k, spec in MOE_SPECS.items() if isolated_spec(spec))
    return _run_all(case.backend, case.device, ids, timeout).get(case.spec_id, "not run")


@functools.cache
def _run_all(backend: str, device: str, spec_ids: tuple, timeout: float) -> dict:
    from hal.backend import Target
    from hal.registry import discover
    from hal.testing.cases import caps_for

    found = {f.name: f.backend for f in discover()}
    target = Target(device, caps_for(device))
    todo = [k for k in spec_ids if found[backend].check(SPECS[k], target).ok]
    results = {}
    while todo:
        request = json.dumps({"backend": backend, "device": device,
                              "specs": {k: attrs.asdict(SPECS[k]) for k in todo}})
        proc = subprocess.run([sys.executable, "-m", "hal.testing.isolated", request],
                              capture_output=True, text=True, timeout=timeout)
        started = None
        for line in proc.stdout.splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if "start" in event:
                started = event["start"]
            else:
                results[event["done"]] = event["error"]
                started = None
        if started is not None:  # the child died inside this case
            results[started] = (f"the call killed the process (exit status {proc.returncode}); "
                                f"stderr tail: {proc.stderr[-600:]!r}")
        elif proc.returncode != 0:
            for k in todo:
                results.setdefault(k, f"child exited {proc.returncode}: {proc.stderr[-1200:]}")
        todo = [k for k in todo if k not in results]
    return results


def check_unchecked_out_of_range(backend: str, device: str, spec) -> None:
    """docs/contract.md: with check=False an id outside [-1, E) is undefined in value but never reads or
    writes out of bounds. Ids of num_experts, a large one and ones below -1 go in; the call may
    raise, but must not crash nor write outside out=."""
    import torch

    from hal.testing import harness
    from hal.testing.cases import Case, caps_for

    case = Case(backend, device, "isolated", spec, caps_for(device), ())
    b = harness.built(case)
    x, tw, ti = harness.token_inputs(spec, 9, device, seed=5)
    bad = torch.tensor([spec.num_experts, 1 << 20, -2, -(1 << 20)], dtype=ti.dtype, device=device)
    ti[1:5, 0] = bad
    buffer, out = harness.poisoned_view(x.shape, x.dtype, x.device)
    try:
        b.kernel(x, tw, ti, b.prepared, out=out, check=False)
    except Exception:  # undefined in value: raising is allowed, corrupting memory is not
        pass
    if out.is_cuda:
        torch.cuda.synchronize()
    harness.assert_margins_intact(buffer, out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    request = json.loads(argv[0])
    from hal.spec import MoESpec

    for spec_id, fields in request["specs"].items():
        print(json.dumps({"start": spec_id}), flush=True)
        try:
            check_unchecked_out_of_range(request["backend"], request["device"], MoESpec(**fields))
            error = ""
        except AssertionError as exc:
            error = str(exc)
        print(json.dumps({"done": spec_id, "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
