"""Compile triton_moe's expert GEMM ahead of time, with the launch configs the rule picks for a
recorded GPU profile, for that GPU's target (which need not be present), and print, as JSON, the
matrix instructions and the shared memory of each, and on sm_90 whether ptxas serializes its
wgmmas (its C7515 note, from Triton's own ptxas run verbose on the PTX): every format the profile
supports (mxfp4 on its default, repacked path; fp8_block128 as the default w8a16). Run with
TRITON_INTERPRET=0: the interpreter replaces @triton.jit functions, which then cannot be compiled.

    python tests/triton_moe/aot_compile.py mi300x | rx7900xtx | h200 | ..."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile

import triton
from hal.backends.triton_moe import backend, configs
from hal.backends.triton_moe.gemm import moe_gemm_kernel
from triton.backends.compiler import GPUTarget

import hal
from hal import presets
from hal.backend import Target
from hal.testing.triton_aot import ast_source

MMA = re.compile(r"(wgmma\.mma_async[\w.]+|mma\.sync[\w.]+|v_mfma\w+|v_wmma\w+|tcgen05\.mma[\w.]*)")
# (format, layer, local experts, token counts): the repacked mxfp4 path's every tile shape, the
# others' decode and prefill tiles, and an EP rank at 1 token, whose GEMM 1 splits K
CASES = (("mxfp4", "gpt-oss-120b", None, (1, 512, 4096)), ("bf16", "qwen3-30b-a3b", None, (1, 4096)),
         ("fp8_block128", "qwen3-30b-a3b", None, (1, 4096)), ("int4_g128", "qwen3-30b-a3b", None, (1, 4096)),
         ("int4_g128", "deepseek-v3", 32, (1,)))
# format -> (weights, scales) as prepare_weights hands them to the kernel
WEIGHTS = {"mxfp4": ("*i32", "*i32"), "bf16": ("*bf16", "*bf16"), "fp8_block128": ("*fp8e4nv", "*fp32"),
           "int4_g128": ("*i32", "*bf16")}
POINTERS = dict(a_ptr="*bf16", bias_ptr="*fp32", out_ptr="*bf16", sorted_routes_ptr="*i32",
                block_expert_ptr="*i32", topk_weights_ptr="*fp32", topk_ids_ptr="*i32",
                expert_map_ptr="*i32", ws_ptr="*fp32", counter_ptr="*i32")
FLOATS = ("swiglu_alpha", "swiglu_limit")
# integer arguments that hold multiples of 16 for every CASES layer: a real launch specializes them
# (and every pointer) as such, which lets Triton vectorize and pipeline the tile loads
MULTIPLES_OF_16 = ("N", "K", "N_TOTAL", "stride_we", "stride_se", "group_size")


def source(fmt: str, constexprs: dict):
    weights, scales = WEIGHTS[fmt]
    # the launch passes the weights where a 16-bit input has no scales and GEMM 1 writes no e4m3
    pointers = dict(POINTERS, w_ptr=weights, s_ptr=scales, a_scale_ptr=weights, out_scale_ptr=weights)
    types = {n: pointers.get(n, "fp32" if n in FLOATS else "i32") for n in moe_gemm_kernel.arg_names}
    return ast_source(moe_gemm_kernel, types, constexprs, MULTIPLES_OF_16)


def serialized_wgmma(ptx: str, arch: int) -> bool:
    """ptxas's C7515 for this PTX: wgmmas waited for one by one (a register they use written while
    one is in flight), where they could overlap each other and the code between them."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run([get_ptxas(arch).path, "-v", f"-arch=sm_{arch}a", f.name, "-o", "/dev/null"],
                              capture_output=True, text=True, check=True)
    return "C7515" in done.stderr


def gpu_target(gpu) -> GPUTarget:
    if gpu.vendor == "amd":
        return GPUTarget("hip", gpu.arch, gpu.warp_size)
    major, minor = gpu.compute_capability
    return GPUTarget("cuda", 10 * major + minor, gpu.warp_size)


def compile_all(profile: str) -> list:
    caps = hal.probe(profile=profile)
    gpu = caps.gpus[0]
    results = []
    for fmt, model, local, tokens_list in CASES:
        spec = presets.get(model).spec(fmt, **({} if local is None else {"num_local_experts": local}))
        if not backend.check(spec, Target("cuda:0", caps)).ok:
            continue
        seen = set()
        for tokens in tokens_list:
            choice = configs.choose(spec, gpu, tokens)
            for first, gemm in ((True, choice.gemm1), (False, choice.gemm2)):
                if (first, choice.block_m, gemm) in seen:
                    continue
                seen.add((first, choice.block_m, gemm))
                constexprs = dict(
                    FIRST=first, TOP_K=spec.top_k, FORMAT=configs.FORMAT_CODES[fmt],
                    ACTIVATION=configs.ACTIVATION_CODES[spec.activation], HAS_BIAS=spec.has_bias,
                    A_FP8=False, A_TERMS=1, A_QUANTIZED=False, OUT_FP8=False, DOT_F32=False,
                    MXFP4_DOT_SCALED=False, REPACKED=fmt in ("mxfp4", "int4_g128"), SCALE_HIGH=fmt == "mxfp4",
                    PAIR_FMA=fmt in ("mxfp4", "int4_g128") and gpu.vendor == "nvidia", A_FORMAT="bf16",
                    BLOCK_M=choice.block_m, BLOCK_N=gemm.block_n, BLOCK_K=gemm.block_k,
                    SWAP_AB=gemm.swap_ab, PER_ROUTE=False, LOCAL_EXPERTS=spec.local_experts,
                    HAS_MAP=spec.is_ep, GROUP_M=gemm.group_m, SPLIT_K=gemm.split_k)
                kernel = triton.compile(source(fmt, constexprs), target=gpu_target(gpu),
                                        options=dict(num_warps=gemm.num_warps, num_stages=gemm.num_stages))
                asm = kernel.asm.get("amdgcn" if gpu.vendor == "amd" else "ptx", "")
                arch = gpu_target(gpu).arch
                results.append(dict(format=fmt, tokens=tokens, gemm=1 if first else 2, ep=spec.is_ep,
                                    block_m=choice.block_m, block_n=gemm.block_n, swap_ab=gemm.swap_ab,
                                    split_k=gemm.split_k,
                                    shared=kernel.metadata.shared, smem_limit=gpu.smem_per_block_optin,
                                    mma=sorted(set(MMA.findall(asm))), pair_fma="fma.rn.bf16x2" in asm,
                                    serialized_wgmma=arch == 90 and serialized_wgmma(asm, arch)))
    return results


if __name__ == "__main__":
    print(json.dumps(compile_all(sys.argv[1])))
