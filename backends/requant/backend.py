"""The requant backend object: which specs and targets it runs, from (spec, caps) alone. Neither
torch nor Triton is imported here; build() imports the Triton kernels, so a missing or broken
Triton is a failed build with its reason, and selection builds the next backend."""

from __future__ import annotations

from hal.backends.requant.plan import GEMM_NOTE
from hal.backends.requant.support import gpu_problems

from hal.backend import RANK_PORTABLE_FAST, triton_interpreting
from hal.ops import op_of
from hal.spec import MoESpec
from hal.verdict import Verdict


def spec_problems(spec) -> list:
    """Every reason the spec is not one the requant backend serves."""
    op = op_of(spec).name
    if op == "moe_masked" and spec.weight_format != "w4afp8":
        return [f"serves the masked MoE only for weight_format='w4afp8', not {spec.weight_format!r}"]
    if op == "moe":
        return ["serves the requant and moe_masked ops (w4afp8), not the token-layout moe op"]
    return []


def target_problems(target) -> list:
    if target.is_cpu:
        if triton_interpreting():
            return []
        return ["needs a GPU: on CPU its Triton kernels run only under TRITON_INTERPRET=1"]
    return gpu_problems(target.gpu)


def _notes(spec, target) -> list:
    if target.is_cpu:
        where = "Triton interpreter on CPU (TRITON_INTERPRET=1)"
    else:
        gpu = target.gpu
        where = f"Triton on {gpu.name or gpu.arch}, warp size {gpu.warp_size}, FP8 {gpu.features.fp8}"
    notes = [f"requant on {where}: [g, 128] tiles sized in bytes per lane, m-grid from expected rows, "
             "hot-expert rows shared in a second phase"]
    if isinstance(spec, MoESpec):
        notes.append(GEMM_NOTE)
    return notes


class RequantBackend:
    name = "requant"
    ops = ("requant", "moe_masked")
    packages = ("triton",)  # its kernels are Triton programs

    def check(self, spec, target) -> Verdict:
        reasons = spec_problems(spec) + target_problems(target)
        if reasons:
            return Verdict.reject(*reasons)
        # The interpreter runs the kernels correctly but far too slowly to be chosen: tests and
        # `prefer="requant"` name it.
        return Verdict.accept(*_notes(spec, target), explicit_only=target.is_cpu)

    def rank(self, spec, target) -> int:
        return RANK_PORTABLE_FAST

    def build(self, spec, target):
        from hal.backends.requant.kernels import BY_OP

        problems = spec_problems(spec) + target_problems(target)
        if problems:
            raise ValueError("; ".join(problems))
        return BY_OP[op_of(spec).name](spec, target)


backend = RequantBackend()
