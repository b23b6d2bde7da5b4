"""The w4afp8 backend object: which specs and targets it runs, from (spec, caps) alone. Neither
torch nor Triton is imported here; build() imports the Triton kernels, so a missing or broken
Triton is a failed build with its reason, and selection builds the next backend."""

from __future__ import annotations

from hal.backend import RANK_SPECIALIZED, triton_interpreting
from hal.spec import MoESpec
from hal.verdict import Verdict

NAME = "w4afp8"
# NVIDIA compute capability of the first FP8 MMA (Ada, sm_89), which Triton's tl.dot lowers to.
MIN_NVIDIA_FP8_MMA = (8, 9)


def spec_problems(spec) -> list:
    if not isinstance(spec, MoESpec):
        return [f"serves the masked MoE (hal.MoESpec), not {type(spec).__name__}"]
    reasons = []
    if spec.weight_format != "w4afp8":
        reasons.append(f"serves weight_format='w4afp8' only, not {spec.weight_format!r}")
    if spec.layout != "masked":
        reasons.append(f"serves layout='masked' (DeepEP low-latency) only, not {spec.layout!r}")
    return reasons


def gpu_problems(gpu) -> list:
    """Every reason this GPU has no FP8 MMA that Triton reaches."""
    if gpu is None:
        return ["no GPU capabilities for this device"]
    name = gpu.name or gpu.arch or "this GPU"
    reasons = []
    if not gpu.warp_size:
        reasons.append(f"the warp size of {name} is unknown ({gpu.unknown.get('warp_size', 'not probed')})")
    if gpu.features.fp8 not in ("ocp", "fnuz"):
        reasons.append(f"{name} ({gpu.arch}) has no FP8 e4m3 encoding")
    if gpu.vendor == "nvidia":
        cc = gpu.compute_capability
        if cc is None or cc < MIN_NVIDIA_FP8_MMA:
            need = "sm_{}{}".format(*MIN_NVIDIA_FP8_MMA)
            reasons.append(f"{gpu.arch} has no FP8 MMA: it needs {need} or newer")
    elif gpu.vendor == "amd":
        if not gpu.features.mfma:
            reasons.append(f"{name} ({gpu.arch}) has no MFMA matrix cores (CDNA3 gfx942 has FP8 MFMA)")
    else:
        reasons.append(f"GPU vendor {gpu.vendor!r} is neither nvidia nor amd")
    return reasons


def target_problems(target) -> list:
    if target.is_cpu:
        if triton_interpreting():
            return []
        return ["needs a GPU with FP8 MMA: on CPU its Triton kernels run only under TRITON_INTERPRET=1"]
    return gpu_problems(target.gpu)


def _notes(target) -> list:
    if target.is_cpu:
        where = "the Triton interpreter on CPU (TRITON_INTERPRET=1; fp32 MMA, for tests)"
    else:
        gpu = target.gpu
        where = f"{gpu.name or gpu.arch}, FP8 {gpu.features.fp8} MMA, warp size {gpu.warp_size}"
    return [f"Triton W4A8 grouped GEMMs on {where}: int4 g128 unpacked to FP8 in registers, group "
            "scales on the fp32 accumulator, activation and FP8 requant fused into GEMM 1, per-token-"
            "group input requantized inside GEMM 1"]


class W4AFp8Backend:
    name = NAME
    ops = ("moe_masked",)
    packages = ("triton",)  # its kernels are Triton programs

    def check(self, spec, target) -> Verdict:
        reasons = spec_problems(spec) + target_problems(target)
        # The interpreter runs the kernels correctly but far too slowly to be chosen: tests and
        # `prefer="w4afp8"` name it.
        return Verdict.from_reasons(reasons, () if reasons else _notes(target),
                                    explicit_only=target.is_cpu)

    def rank(self, spec, target) -> int:
        return RANK_SPECIALIZED

    def build(self, spec, target):
        from hal.backends.w4afp8.kernel import W4AFp8MaskedKernel

        problems = spec_problems(spec) + target_problems(target)
        if problems:
            raise ValueError("; ".join(problems))
        return W4AFp8MaskedKernel(spec, target)


backend = W4AFp8Backend()
