"""The Triton MoE backend object: support questions only. check() and rank() read (spec, target)
and import neither torch nor Triton; build() does."""

from __future__ import annotations

from hal.backends.triton_moe import support

from hal.backend import RANK_PORTABLE_FAST, RANK_SPECIALIZED, triton_interpreting
from hal.verdict import Verdict

NAME = "triton_moe"
RANK_GPU = RANK_PORTABLE_FAST
# int4 without an expert map on wgmma GPUs: above marlin (RANK_SPECIALIZED, mma.sync). Side by
# side on marlin's seven benchmark layers at 1-2048 tokens on an H100 (benchmarks/marlin_peer.py
# --triton-moe; docs/backends/triton_moe.md), it ran 1.12x marlin's speed over the five layers
# without a map, ahead at 19 of 25 points and level or ahead at every point from 256 tokens. On
# the two EP ranks each led about half the points (1.01x), marlin at 1-8 tokens (1.07-1.21x), so
# marlin keeps EP ranks; other NVIDIA archs were not measured and keep marlin too.
RANK_INT4_WGMMA = RANK_SPECIALIZED + 10


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
        if _leads_marlin(spec, gpu):
            notes.append("int4 ranks above marlin (measured ahead on wgmma GPUs without an expert map)")
        elif gpu.features.wgmma:
            notes.append("int4 ranks below marlin on an EP rank, where marlin leads at decode")
        else:
            notes.append("int4 ranks below marlin: not measured ahead of it on this arch")
    return notes


def _leads_marlin(spec, gpu) -> bool:
    return (spec.weight_format == "int4_g128" and gpu.vendor == "nvidia" and gpu.features.wgmma
            and not spec.is_ep)


class TritonMoEBackend:
    name = NAME
    ops = ("moe",)
    packages = ("triton",)  # its kernels are Triton programs
    act_quants = support.ACT_QUANTS

    def check(self, spec, target) -> Verdict:
        reasons = support.spec_problems(spec) + _target_problems(spec, target)
        # The interpreter runs the kernels correctly but far too slowly to be chosen: tests and
        # `prefer="triton_moe"` name it.
        return Verdict.from_reasons(reasons, () if reasons else _notes(spec, target),
                                    explicit_only=target.is_cpu)

    def rank(self, spec, target) -> int:
        if not target.is_cpu and _leads_marlin(spec, target.gpu):
            return RANK_INT4_WGMMA
        return RANK_GPU

    def build(self, spec, target):
        from hal.backends.triton_moe.kernel import TritonMoEKernel

        problems = support.spec_problems(spec) + _target_problems(spec, target)
        if problems:
            raise ValueError("; ".join(problems))
        return TritonMoEKernel(spec, target)


backend = TritonMoEBackend()
