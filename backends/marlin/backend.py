"""The marlin backend object: which specs and GPUs the Marlin kernels run, from (spec, caps)
alone. The toolchain (a CUDA build of torch, an nvcc that targets the GPU's arch) is checked in
build(), so a host without it fails the build with the reason and selection builds the next
backend."""

from __future__ import annotations

from hal.backends.marlin.build import arch_problems

from hal import jit
from hal.backend import RANK_SPECIALIZED
from hal.verdict import Verdict

# The routing kernel keeps two ints per global expert in shared memory, within the 48 KiB that
# needs no opt-in.
MAX_EXPERTS = 4096
# K and N of both GEMMs must be whole 64-wide tiles (the smallest thread_k and thread_n).
SHAPE_MULTIPLE = 64
# The (thread_k, thread_n) tiles csrc/cuda/marlin_moe_configs.h compiles, the same at every block_m
# (tests/marlin/test_marlin_configs.py holds this to the header): a GEMM runs only if one tiles it.
TILES = ((64, 128), (64, 256), (128, 64), (128, 128), (128, 256))


def gemm_shapes(spec) -> tuple:
    """(name, n, k) of the two GEMMs: GEMM 1 makes 2I gate/up columns (I for relu2) over H, GEMM 2
    makes H over I."""
    n13 = spec.intermediate_size * (1 if spec.activation == "relu2" else 2)
    return (("GEMM 1", n13, spec.hidden_size), ("GEMM 2", spec.hidden_size, spec.intermediate_size))


def spec_problems(spec) -> list:
    """Every reason the Marlin kernels cannot run this moe spec."""
    problems = []
    if spec.weight_format != "int4_g128":
        problems.append(f"weight_format={spec.weight_format}: Marlin runs int4_g128 (GPTQ uint4b8) only")
    for name in ("hidden_size", "intermediate_size"):
        value = getattr(spec, name)
        if value % SHAPE_MULTIPLE:
            problems.append(f"{name}={value} is not a multiple of {SHAPE_MULTIPLE} (the smallest tile)")
    if not problems:
        for gemm, n, k in gemm_shapes(spec):
            if not any(n % tn == 0 and k % tk == 0 for tk, tn in TILES):
                problems.append(f"no compiled tile covers {gemm} (n={n}, k={k}): it needs k a multiple "
                                "of 128, or n a multiple of 128")
    if spec.num_experts > MAX_EXPERTS:
        problems.append(f"num_experts={spec.num_experts} exceeds the routing kernel's {MAX_EXPERTS}")
    return problems


class MarlinBackend:
    name = "marlin"
    ops = ("moe",)

    def check(self, spec, target) -> Verdict:
        reasons = spec_problems(spec)
        if target.is_cpu:
            reasons.append("needs an NVIDIA GPU (sm_80 or newer); the target is the CPU")
        else:
            reasons += arch_problems(target.gpu, target.device)
        notes = ()
        if not reasons:
            ep = "kIsEP" if spec.is_ep else "no EP"
            bias = "kHasBias" if spec.has_bias else "no bias"
            notes = (f"W4A16 mma.sync on {target.gpu.arch}, {spec.act_dtype}, {ep}, {bias}, "
                     "occupancy-aware launch config",)
        return Verdict.from_reasons(reasons, notes)

    def rank(self, spec, target) -> int:
        return RANK_SPECIALIZED

    def build(self, spec, target):
        from hal.backends.marlin import build
        from hal.backends.marlin.kernel import MarlinMoEKernel

        # A recorded profile describes another machine: its toolchain is checked there, when the
        # kernel compiles; the kernel object still plans for the profile.
        if target.caps.profile is None:
            problems = build.toolchain_problems(target.gpu.arch)
            if problems:
                raise build.ToolchainError("; ".join(problems))
            jit.usable_cache_dir()  # an unusable HAL_CACHE_DIR fails the build, not the first call
        return MarlinMoEKernel(spec, target)


backend = MarlinBackend()
