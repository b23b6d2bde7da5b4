"""The Triton MoE backend object: support questions only. check() and rank() read (spec, target)
and import neither torch nor Triton; build() does."""

from __future__ import annotations

from backends.triton_moe import support
from hal.backend import RANK_PORTABLE_FAST, triton_interpreting
from hal.verdict import Verdict

NAME = "triton_moe"
# int4_g128 on NVIDIA: Marlin (RANK_SPECIALIZED) is ranked above this portable kernel; on AMD this
# is the int4 kernel.
RANK_GPU = RANK_PORTABLE_FAST


def _target_problems(spec, target) -> list:
    if target.is_cpu:
        if triton_interpreting():
            return []
        return ["needs a GPU: on CPU its Triton kernels run only under TRITON_INTERPRET=1"]
    return support.gpu_problems(spec, target.gpu)


def _notes(spec, target) -> list:
    if target.is_cpu:
        return ["Triton interpreter on CPU (TRITON_INTERPRET=1)"]
    gpu = target.gpu
    notes = [f"fused Triton MoE on {gpu.name or gpu.arch}: align routes -> GEMM1 + {spec.activation} -> "
             f"GEMM2 x topk weight -> top-k sum, {spec.weight_format} dequantized in registers"]
    if spec.weight_format == "int4_g128" and gpu.vendor == "nvidia":
        notes.append("int4 on NVIDIA ranks below marlin (RANK_SPECIALIZED)")
    return notes


class TritonMoEBackend:
    name = NAME
    ops = ("moe",)

    def check(self, spec, target) -> Verdict:
        reasons = support.spec_problems(spec) + _target_problems(spec, target)
        # The interpreter runs the kernels correctly but far too slowly to be chosen: tests and
        # `prefer="triton_moe"` name it.
        return Verdict.from_reasons(reasons, () if reasons else _notes(spec, target),
                                    explicit_only=target.is_cpu)

    def rank(self, spec, target) -> int:
        return RANK_GPU

    def build(self, spec, target):
        from backends.triton_moe.kernel import TritonMoEKernel

        problems = support.spec_problems(spec) + _target_problems(spec, target)
        if problems:
            raise ValueError("; ".join(problems))
        return TritonMoEKernel(spec, target)


backend = TritonMoEBackend()
