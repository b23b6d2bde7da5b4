"""The cpu_brgemm backend object: can it run a spec on a target, how highly it ranks, and the
kernel it builds."""

from __future__ import annotations

import os
import shutil

from hal.backends.cpu_brgemm.policy import BRGEMM_MIN_ROWS, FORMAT_CODES, SIZE_MULTIPLE

from hal import jit
from hal.backend import RANK_PORTABLE_FAST, RANK_SPECIALIZED, Target
from hal.spec import MoESpec
from hal.verdict import Verdict


def isa_for(cpu):
    """The micro-kernel ISA this CPU runs: AVX-512-BF16 where present, else AVX2/FMA, else None.
    (This module stays free of torch, so selection imports it cheaply.)"""
    if cpu.isa.avx512 and cpu.isa.avx512_bf16:
        return "avx512bf16"
    if cpu.isa.avx2 and cpu.isa.fma:
        return "avx2"
    return None


class CpuBrgemmBackend:
    name = "cpu_brgemm"
    ops = ("moe",)

    def check(self, spec, target: Target) -> Verdict:
        reasons = []
        if not target.is_cpu:
            reasons.append(f"cpu_brgemm runs on the CPU; the target is {target.device}")
        if not isinstance(spec, MoESpec):
            return Verdict.reject(*reasons, "cpu_brgemm serves the MoE op only, not "
                                  f"{type(spec).__name__}")
        if spec.layout != "tokens":
            reasons.append(f"layout={spec.layout!r} is not supported: cpu_brgemm takes the token layout")
        if spec.weight_format not in FORMAT_CODES:
            reasons.append(f"weight_format={spec.weight_format!r} is not supported: cpu_brgemm "
                           f"reads {', '.join(FORMAT_CODES)}")
        if spec.act_dtype != "bfloat16":
            reasons.append(f"act_dtype={spec.act_dtype!r} is not supported: cpu_brgemm takes "
                           "bfloat16 activations")
        for field in ("hidden_size", "intermediate_size"):
            value = getattr(spec, field)
            if value % SIZE_MULTIPLE:
                reasons.append(f"{field}={value} is not a multiple of {SIZE_MULTIPLE}: cpu_brgemm "
                               f"packs weights in panels of {SIZE_MULTIPLE} columns")
        isa = isa_for(target.cpu) if target.is_cpu else None
        if target.is_cpu and isa is None:
            reasons.append("the CPU has neither AVX-512-BF16 nor AVX2+FMA (per its capabilities): "
                           "cpu_brgemm's micro-kernels need one of them")
        return Verdict.from_reasons(reasons, notes=self._notes(target, isa) if isa else ())

    @staticmethod
    def _notes(target: Target, isa: str):
        amx = target.cpu.amx
        if amx.usable and isa == "avx512bf16":
            return (f"BRGEMM (AMX) for expert blocks of more than {BRGEMM_MIN_ROWS} rows, "
                    "TinyGEMM AVX-512-BF16 for smaller ones",)
        why = amx.reason or "no amx_tile"
        if isa == "avx512bf16":
            return (f"AMX not usable ({why}): TinyGEMM AVX-512-BF16 for every block",)
        return (f"no AVX-512-BF16 or AMX ({why}): TinyGEMM AVX2 for every block",)

    def rank(self, spec, target: Target) -> int:
        return RANK_SPECIALIZED if target.cpu.amx.usable and isa_for(target.cpu) == "avx512bf16" \
            else RANK_PORTABLE_FAST

    def build(self, spec, target: Target):
        from hal.backends.cpu_brgemm.kernel import CpuBrgemmKernel

        # The extension compiles on first use with the compiler torch's extension builder runs;
        # without one the build fails here and selection builds the next backend.
        compiler = os.environ.get("CXX", "c++")
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler: {compiler!r} (CXX) is not on PATH, so the "
                               "cpu_brgemm extension cannot be built")
        jit.usable_cache_dir()  # an unusable HAL_CACHE_DIR fails the build, not the first call
        return CpuBrgemmKernel(spec, target)


backend = CpuBrgemmBackend()
