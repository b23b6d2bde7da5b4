"""Compile triton_moe's repacked-mxfp4 GEMMs ahead of time, with the launch configs the rule picks
for a recorded GPU profile, for that GPU's target (which need not be present), and print, as JSON,
the matrix instructions and the shared memory of each. Run with TRITON_INTERPRET=0: the
interpreter replaces @triton.jit functions, which then cannot be compiled.

    python tests/triton_moe/aot_compile_mxfp4.py mi300x | rx7900xtx | h200 | ..."""

from __future__ import annotations

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import hal
from backends.triton_moe import configs
from backends.triton_moe.gemm import moe_gemm_kernel
from hal import presets

MMA = re.compile(r"(wgmma\.mma_async[\w.]+|mma\.sync[\w.]+|v_mfma\w+|v_wmma\w+|tcgen05\.mma[\w.]*)")
TOKENS = (1, 8, 512, 4096)
POINTERS = dict(a_ptr="*bf16", a_scale_ptr="*i32", w_ptr="*i32", s_ptr="*u8", bias_ptr="*fp32",
                out_ptr="*bf16", out_scale_ptr="*i32", sorted_routes_ptr="*i32", block_expert_ptr="*i32",
                topk_weights_ptr="*fp32", topk_ids_ptr="*i32", expert_map_ptr="*i32")
FLOATS = ("swiglu_alpha", "swiglu_limit")


def source(constexprs: dict) -> ASTSource:
    names = moe_gemm_kernel.arg_names
    types = {n: POINTERS.get(n, "fp32" if n in FLOATS else "i32") for n in names}
    signature = {n: "constexpr" if n in constexprs else types[n] for n in names}
    # every pointer a real launch passes is 16-byte aligned: Triton specializes them so
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in POINTERS}
    return ASTSource(fn=moe_gemm_kernel, signature=signature, attrs=attrs,
                     constexprs={(names.index(k),): v for k, v in constexprs.items()})


def gpu_target(gpu) -> GPUTarget:
    if gpu.vendor == "amd":
        return GPUTarget("hip", gpu.arch, gpu.warp_size)
    major, minor = gpu.compute_capability
    return GPUTarget("cuda", 10 * major + minor, gpu.warp_size)


def compile_all(profile: str) -> list:
    gpu = hal.probe(profile=profile).gpus[0]
    target = gpu_target(gpu)
    spec = presets.get("gpt-oss-120b").spec("mxfp4")
    results, seen = [], set()
    for tokens in TOKENS:
        choice = configs.choose(spec, gpu, tokens)
        for first, gemm in ((True, choice.gemm1), (False, choice.gemm2)):
            key = (first, choice.block_m, gemm)
            if key in seen:
                continue
            seen.add(key)
            constexprs = dict(
                FIRST=first, TOP_K=spec.top_k, FORMAT=configs.FORMAT_CODES["mxfp4"],
                ACTIVATION=configs.ACTIVATION_CODES[spec.activation], HAS_BIAS=spec.has_bias,
                A_FP8=False, A_QUANTIZED=False, OUT_FP8=False, DOT_F32=False, MXFP4_DOT_SCALED=False,
                MXFP4_REPACKED=True, SCALE_HIGH=True, A_FORMAT="bf16", BLOCK_M=choice.block_m,
                BLOCK_N=gemm.block_n, BLOCK_K=gemm.block_k, SWAP_AB=gemm.swap_ab, PER_ROUTE=False,
                LOCAL_EXPERTS=spec.local_experts, HAS_MAP=False, GROUP_M=gemm.group_m)
            kernel = triton.compile(source(constexprs), target=target,
                                    options=dict(num_warps=gemm.num_warps, num_stages=gemm.num_stages))
            asm = kernel.asm.get("amdgcn" if gpu.vendor == "amd" else "ptx", "")
            results.append(dict(tokens=tokens, gemm=1 if first else 2, block_m=choice.block_m,
                                block_n=gemm.block_n, swap_ab=gemm.swap_ab, shared=kernel.metadata.shared,
                                smem_limit=gpu.smem_per_block_optin, mma=sorted(set(MMA.findall(asm)))))
    return results


if __name__ == "__main__":
    print(json.dumps(compile_all(sys.argv[1])))
