"""backends.reference: every op in plain torch. The oracle of every test, and the fallback that
accepts any spec on any device, ranked last."""

from __future__ import annotations

from hal.backend import RANK_REFERENCE
from hal.spec import MoESpec, RequantSpec
from hal.verdict import Verdict


class ReferenceBackend:
    # check() runs on every `hal probe`, so this module imports no torch; build() does.
    name = "reference"
    ops = ("moe", "requant")

    def check(self, spec, target) -> Verdict:
        where = "CPU" if target.is_cpu else target.device
        return Verdict.accept(f"portable torch implementation on {where}; the oracle, ranked last")

    def rank(self, spec, target) -> int:
        return RANK_REFERENCE

    def build(self, spec, target):
        from backends.reference.kernels import (
            ReferenceMaskedKernel,
            ReferenceMoEKernel,
            ReferenceRequantKernel,
        )

        if isinstance(spec, RequantSpec):
            return ReferenceRequantKernel(spec, target)
        if isinstance(spec, MoESpec) and spec.layout == "masked":
            return ReferenceMaskedKernel(spec, target)
        return ReferenceMoEKernel(spec, target)


backend = ReferenceBackend()
