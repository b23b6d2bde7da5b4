"""The reference backend object: accepts every spec of every op on every device, ranked last."""

from __future__ import annotations

from hal.backend import RANK_REFERENCE
from hal.ops import op_of
from hal.verdict import Verdict


class ReferenceBackend:
    # check() runs on every `hal probe`, so this module imports no torch; build() does.
    name = "reference"
    ops = ("moe", "moe_masked", "requant")
    act_quants = ("none", "fp8_g128")

    def check(self, spec, target) -> Verdict:
        where = "CPU" if target.is_cpu else target.device
        return Verdict.accept(f"portable torch implementation on {where}; the oracle, ranked last")

    def rank(self, spec, target) -> int:
        return RANK_REFERENCE

    def build(self, spec, target):
        from hal.backends.reference import kernels

        return kernels.BY_OP[op_of(spec).name](spec, target)


backend = ReferenceBackend()
