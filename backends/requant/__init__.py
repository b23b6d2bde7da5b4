"""backends.requant: the Triton per-token-group FP8 -> per-tensor FP8 requant of the DeepEP masked
layout, with a warp-size-aware launch geometry and a second phase that shares a hot expert's rows.
It serves the requant op and the w4afp8 masked MoE (its GEMM stages on backends.reference).

Triton is imported only when a kernel is built, so a machine without Triton gets a rejection with
the reason rather than a failed import."""

from __future__ import annotations

import functools
import importlib.util

from backends.requant.geometry import RequantGeometry, requant_launch_geometry
from backends.requant.plan import GEMM_NOTE
from backends.requant.support import gpu_problems, interpreting
from hal.backend import RANK_PORTABLE_FAST, RANK_REFERENCE
from hal.spec import MoESpec, RequantSpec
from hal.verdict import Verdict

NAME = "requant"
# Under the Triton interpreter on CPU the kernels run (for tests, by prefer="requant") but slowly,
# so they rank below the reference and never win a CPU selection by default.
RANK_INTERPRETED = RANK_REFERENCE - 1


@functools.lru_cache(maxsize=1)
def _triton_problems() -> tuple:
    """Found without importing it: check() runs on every `hal probe`. A Triton that is installed
    but broken fails in build(), and selection then builds the next backend."""
    if importlib.util.find_spec("triton") is None:
        return ("Triton is not installed",)
    return ()


def _spec_problems(spec) -> list:
    if isinstance(spec, RequantSpec):
        return []
    if isinstance(spec, MoESpec) and spec.weight_format == "w4afp8" and spec.layout == "masked":
        return []
    if isinstance(spec, MoESpec):
        return [f"serves MoE only for weight_format='w4afp8' with layout='masked', not "
                f"weight_format={spec.weight_format!r} layout={spec.layout!r}"]
    return [f"serves hal.RequantSpec and hal.MoESpec, not {type(spec).__name__}"]


def _target_problems(target) -> list:
    if target.is_cpu:
        if interpreting():
            return []
        return ["needs a GPU: on CPU its Triton kernels run only under TRITON_INTERPRET=1"]
    return gpu_problems(target.gpu)


def _notes(spec, target) -> list:
    if target.is_cpu:
        where = "Triton interpreter on CPU (TRITON_INTERPRET=1; for tests, ranked below reference)"
    else:
        gpu = target.gpu
        where = f"Triton on {gpu.name or gpu.arch}, warp size {gpu.warp_size}, FP8 {gpu.features.fp8}"
    notes = [f"requant on {where}: [g, 128] tiles sized in bytes per lane, m-grid from expected rows, "
             "hot-expert rows shared in a second phase"]
    if isinstance(spec, MoESpec):
        notes.append(GEMM_NOTE)
    return notes


class RequantBackend:
    name = NAME
    ops = ("requant", "moe")

    def check(self, spec, target) -> Verdict:
        reasons = _spec_problems(spec) + _target_problems(target)
        if not reasons:
            reasons = list(_triton_problems())
        return Verdict.from_reasons(reasons, _notes(spec, target) if not reasons else ())

    def rank(self, spec, target) -> int:
        return RANK_INTERPRETED if target.is_cpu else RANK_PORTABLE_FAST

    def build(self, spec, target):
        from backends.requant.kernels import RequantTritonKernel, W4AFp8MaskedKernel

        problems = _spec_problems(spec) + _target_problems(target)
        if problems:
            raise ValueError("; ".join(problems))
        if isinstance(spec, RequantSpec):
            return RequantTritonKernel(spec, target)
        return W4AFp8MaskedKernel(spec, target)


backend = RequantBackend()

__all__ = ["RequantGeometry", "backend", "requant_launch_geometry"]
