"""One requant case for compute-sanitizer: both launches, the second phase included, on a payload
whose last expert ends exactly at the end of the allocation, so a read or write past a live row
of it leaves the buffer.

    compute-sanitizer --tool memcheck python -m backends.requant.memcheck_case"""

from __future__ import annotations

import torch

from backends.reference.ops import requant_fp8
from backends.requant.op import fp8_per_token_to_per_tensor
from hal.synth import random_masked_inputs


def main() -> int:
    x, scale, masked_m = random_masked_inputs(6, 1152, 33, [33, 0, 2, 1, 0, 33], seed=4, device="cuda")
    s_out = torch.tensor([0.02], device="cuda")
    want = requant_fp8(x, scale, masked_m, s_out, torch.zeros_like(x)).view(torch.uint8)
    for geometry, expected_rows in (("tuned", 2), ("tuned", None), ("legacy", None)):
        out = fp8_per_token_to_per_tensor(x, scale, masked_m, s_out, torch.zeros_like(x),
                                          expected_rows=expected_rows, geometry=geometry)
        torch.cuda.synchronize()
        if not torch.equal(out.view(torch.uint8), want):
            print(f"memcheck case: {geometry} expected_rows={expected_rows} differs from the reference")
            return 1
    print("memcheck case: tuned (two phases), tuned (no cap) and legacy match the reference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
