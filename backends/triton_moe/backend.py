"""The Triton MoE backend object: support questions only. check() and rank() read (spec, target)
and import neither torch nor Triton; build() does."""

from __future__ import annotations

from backends.triton_moe import support
from hal.backend import RANK_PORTABLE_FAST, RANK_REFERENCE
from hal.verdict import Verdict

NAME = "triton_moe"
# Under the Triton interpreter on CPU the kernels run (for tests, by prefer="triton_moe") but
# slowly, so they rank below the reference and never win a CPU selection by default.
RANK_INTERPRETED = RANK_REFERENCE - 1
# int4_g128 on NVIDIA: Marlin (RANK_SPECIALIZED) is ranked above this portable kernel; on AMD this
# is the int4 kernel.
RANK_GPU = RANK_PORTABLE_FAST


def _target_problems(spec, target) -> list:
    if target.is_cpu:
        if support.interpreting():
            return []
        return ["needs a GPU: on CPU its Triton kernels run only under TRITON_INTERPRET=1"]
    return support.gpu_problems(spec, target.gpu)


def _notes(spec, target) -> list:
    if target.is_cpu:
        return ["Triton interpreter on CPU (TRITON_INTERPRET=1; for tests, ranked below reference)"]
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
        if not reasons:
            reasons = list(support.triton_problems())
        return Verdict.from_reasons(reasons, _notes(spec, target) if not reasons else ())

    def rank(self, spec, target) -> int:
        return RANK_INTERPRETED if target.is_cpu else RANK_GPU

    def build(self, spec, target):
        from backends.triton_moe.kernel import TritonMoEKernel

        problems = support.spec_problems(spec) + _target_problems(spec, target)
        if problems:
            raise ValueError("; ".join(problems))
        return TritonMoEKernel(spec, target)


backend = TritonMoEBackend()
