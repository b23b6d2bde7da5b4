"""backends.marlin: W4A16 (GPTQ uint4b8, group 128 or per channel) MoE on NVIDIA sm_80+, with
compile-time kIsEP / kHasBias specializations and an occupancy-aware launch config.
Entry point: marlin = "backends.marlin:backend"."""

from __future__ import annotations

from backends.marlin import build
from hal.backend import RANK_SPECIALIZED
from hal.spec import MoESpec
from hal.verdict import Verdict

# The routing kernel keeps two ints per global expert in shared memory, within the 48 KiB that
# needs no opt-in.
MAX_EXPERTS = 4096
# K and N of both GEMMs must be whole 64-wide tiles (the smallest thread_k and thread_n).
SHAPE_MULTIPLE = 64


def spec_problems(spec) -> list:
    if not isinstance(spec, MoESpec):
        return [f"serves the moe op only, not {type(spec).__name__}"]
    problems = []
    if spec.weight_format != "int4_g128":
        problems.append(f"weight_format={spec.weight_format}: Marlin runs int4_g128 (GPTQ uint4b8) only")
    if spec.layout != "tokens":
        problems.append(f"layout={spec.layout}: Marlin runs the token layout only")
    for name in ("hidden_size", "intermediate_size"):
        value = getattr(spec, name)
        if value % SHAPE_MULTIPLE:
            problems.append(f"{name}={value} is not a multiple of {SHAPE_MULTIPLE} (the smallest tile)")
    if spec.num_experts > MAX_EXPERTS:
        problems.append(f"num_experts={spec.num_experts} exceeds the routing kernel's {MAX_EXPERTS}")
    return problems


class MarlinBackend:
    # check() runs on every `hal probe`: nothing here imports torch; build() does.
    name = "marlin"
    ops = ("moe",)

    def check(self, spec, target) -> Verdict:
        reasons = spec_problems(spec)
        notes = []
        if target.is_cpu:
            reasons.append("needs an NVIDIA GPU (sm_80 or newer); the target is the CPU")
        else:
            gpu = target.gpu
            arch_reasons = build.arch_problems(gpu, target.device)
            reasons += arch_reasons
            if not arch_reasons:
                if target.caps.profile is None:
                    reasons += build.toolchain_problems(gpu.arch)
                else:
                    notes.append(f"recorded profile {target.caps.profile!r}: the build toolchain is "
                                 "checked on the machine itself")
        if not reasons:
            ep = "kIsEP" if spec.is_ep else "no EP"
            bias = "kHasBias" if spec.has_bias else "no bias"
            notes.insert(0, f"W4A16 mma.sync on {target.gpu.arch}, {spec.act_dtype}, {ep}, {bias}, "
                            "occupancy-aware launch config")
        return Verdict.from_reasons(reasons, notes)

    def rank(self, spec, target) -> int:
        return RANK_SPECIALIZED

    def build(self, spec, target):
        from backends.marlin.kernel import MarlinMoEKernel

        return MarlinMoEKernel(spec, target)


backend = MarlinBackend()
