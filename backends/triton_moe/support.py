"""Whether a target can run the Triton MoE, from the spec and hal's capabilities alone. The
backend's check() uses this on every `hal probe`, so it imports neither torch nor Triton."""

from __future__ import annotations

from hal.spec import MoESpec

FORMATS = ("bf16", "fp8_block128", "mxfp4", "int4_g128")
ACT_QUANTS = ("none", "fp8_g128")  # fp8_g128: the w8a8 kernels, fp8 weights on FP8 tensor cores
MIN_NVIDIA_CAPABILITY = (8, 0)  # mma.sync bf16 tensor cores, cp.async
# Triton converts OCP e4m3 only on NVIDIA sm_89+ and AMD CDNA3; RDNA3 has no fp8 at all.
MIN_NVIDIA_FP8_CAPABILITY = (8, 9)
AMD_ARCH_PREFIXES = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")
AMD_FP8_ARCH_PREFIXES = ("gfx94", "gfx95")


def spec_problems(spec) -> list:
    if not isinstance(spec, MoESpec):
        return [f"serves the moe op (hal.MoESpec) only, not {type(spec).__name__}"]
    problems = []
    if spec.layout != "tokens":
        problems.append(f"layout={spec.layout!r}: serves the token layout only")
    if spec.weight_format not in FORMATS:
        problems.append(f"weight_format={spec.weight_format!r}: serves " + ", ".join(FORMATS))
    if spec.act_quant == "fp8_g128" and spec.weight_format != "fp8_block128":
        problems.append(f"act_quant='fp8_g128' with weight_format={spec.weight_format!r}: the w8a8 "
                        "kernels quantize activations for fp8_block128 weights only")
    return problems


def _cc(arch: str) -> tuple:
    digits = arch[3:].rstrip("a")
    return int(digits[:-1]), int(digits[-1])


def gpu_problems(spec, gpu) -> list:
    """Every reason this GPU cannot run `spec`, as sentences."""
    if gpu is None:
        return ["no GPU capabilities for this device"]
    name = gpu.name or gpu.arch or "this GPU"
    arch = gpu.arch or ""
    fp8 = isinstance(spec, MoESpec) and spec.weight_format == "fp8_block128"
    if gpu.vendor == "nvidia":
        if not arch.startswith("sm_"):
            return [f"the compute capability of {name} is unknown"]
        cc = _cc(arch)
        if cc < MIN_NVIDIA_CAPABILITY:
            return [f"{arch} is below sm_80: the kernels need bf16 tensor cores"]
        if fp8 and cc < MIN_NVIDIA_FP8_CAPABILITY:
            return [f"{arch} is below sm_89: Triton converts e4m3 weights only from sm_89"]
        return []
    if isinstance(spec, MoESpec) and spec.act_quant == "fp8_g128":
        return [f"act_quant='fp8_g128' on {name}: the w8a8 kernels need NVIDIA FP8 tensor cores (sm_89+)"]
    if gpu.vendor == "amd":
        if not arch.startswith(AMD_ARCH_PREFIXES):
            return [f"{name} ({arch or 'unknown arch'}) is not a CDNA2/3 or RDNA3/4 GPU"]
        if fp8 and not arch.startswith(AMD_FP8_ARCH_PREFIXES):
            return [f"{name} ({arch}) has no fp8: fp8_block128 needs CDNA3 (gfx942) or newer"]
        return []
    return [f"{name}: vendor {gpu.vendor!r} is neither nvidia nor amd"]
