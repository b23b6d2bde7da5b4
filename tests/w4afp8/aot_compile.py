"""Compile the w4afp8 Triton kernels ahead of time for a GPU target that need not be present, and
print, as JSON, the matrix instructions and the shared memory of each. Run with TRITON_INTERPRET=0:
the interpreter replaces @triton.jit functions, which then cannot be compiled.

    python tests/w4afp8/aot_compile.py cuda:90 | cuda:89 | hip:gfx942"""

from __future__ import annotations

import json
import re
import sys

import triton
import triton.language as tl
from hal.backends.w4afp8 import configs, layer, triton_decode, triton_kernels, triton_planes
from triton.backends.compiler import GPUTarget

from hal.testing.triton_aot import ast_source

MAXNREG = re.compile(r"\.maxnreg (\d+)")
MMA = re.compile(r"(wgmma\.mma_async[\w.]+|mma\.sync[\w.]+|v_mfma\w+)")
WGMMA_WAITS = re.compile(r"wgmma\.wait_group\.sync\.aligned (\d+)")


# integer arguments that hold multiples of 16 in every real launch: Triton specializes them (and
# every pointer) as such when it launches, so the AOT compile is told the same.
MULTIPLES_OF_16 = ("max_m", "hidden", "inter", "weight_rows")


def compile_all(target: str) -> list:
    backend, arch = target.split(":")
    hip = backend == "hip"
    gpu = GPUTarget("hip", arch, 64) if hip else GPUTarget("cuda", int(arch), 32)
    fp8, dot = ("fp8e4b8", tl.float8e4b8) if hip else ("fp8e4nv", tl.float8e4nv)
    gemm1 = dict(x_ptr=f"*{fp8}", x_scale_ptr="*fp32", masked_m_ptr="*i32", q_ptr="*i32", s_ptr="*bf16",
                 in_scale_ptr="*fp32", out_scale_ptr="*fp32", h_ptr=f"*{fp8}", max_m="i32", hidden="i32",
                 inter="i32", weight_rows="i32", scale_stride_e="i32", scale_stride_m="i32",
                 scale_stride_g="i32", fp8_max="fp32", swiglu_alpha="fp32", swiglu_limit="fp32",
                 scale_shift="fp32")
    gemm2 = dict(h_ptr=f"*{fp8}", masked_m_ptr="*i32", q_ptr="*i32", s_ptr="*bf16", in_scale_ptr="*fp32",
                 out_ptr="*bf16", max_m="i32", inter="i32", hidden="i32", scale_shift="fp32")
    results = []
    # the default rule's planes and folded tiles (per-group ones where there is no wgmma), the
    # per-group rule's bf16 and FP8 tiles, and the rows-on-M baseline's smallest and largest
    for rule, rows in (("transposed", 8), ("transposed", 48), ("transposed", 200), ("per_group", 48),
                       ("per_group", 200), ("rows_on_m", 8), ("rows_on_m", 200)):
        tile = configs.gemm_tile(rows, "amd" if hip else "nvidia", wgmma=arch == "90", rule=rule)
        common = dict(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, GROUP_K=configs.GROUP_K)
        if tile.path == "planes":
            # int32 weight words and a split-K workspace (K split in three, as on an H200 at 8 experts)
            module, prefix = triton_planes, "w4a8_planes_"
            halves = dict(q_ptr="*i32", ws_ptr="*fp32", counter_ptr="*i32", split_blocks="i32")
            common.update(DOT_DTYPE=tl.float16, MAGIC=not hip, SPLIT_K=3)
        elif tile.transposed:
            # int16 weight halves and a split-K workspace (K split in two, as on an H200 at 8
            # experts); the folded path reads x and h as fp16
            module, prefix = triton_decode, "w4a8_decode_"
            halves = dict(q_ptr="*i16", ws_ptr="*fp32", counter_ptr="*i32", split_blocks="i32")
            fold = tile.path == "folded"
            if fold:
                halves.update(x_ptr="*fp16", h_ptr="*fp16")
            sixteen = {"decode": tl.bfloat16, "folded": tl.float16}.get(tile.path)
            common.update(DOT_DTYPE=sixteen or dot, MAGIC=sixteen is not None and not hip, SPLIT_K=2,
                          FOLD=fold)
        else:
            module, prefix, halves = triton_kernels, "w4a8_", {}
            common.update(DOT_DTYPE=dot)
        first = dict(common, ACTIVATION=triton_kernels.ACTIVATION_CODES["silu"], GROUP_SCALED=True)
        if module is triton_decode:
            first.update(FP8=dot, GROUP_SCALED=tile.path != "folded")  # folded: the requant feed
        cases = [("gemm1", getattr(module, f"{prefix}gemm1_kernel"), {**gemm1, **halves}, first),
                 ("gemm2", getattr(module, f"{prefix}gemm2_kernel"), {**gemm2, **halves}, common)]
        for name, fn, types, constexprs in cases:
            kernel = triton.compile(ast_source(fn, types, constexprs, MULTIPLES_OF_16), target=gpu,
                                    options=layer.launch_options(tile))
            asm = kernel.asm.get("amdgcn" if hip else "ptx", "")
            results.append(dict(kernel=name, rule=rule, path=tile.path, block_m=tile.block_m,
                                shared=kernel.metadata.shared, mma=sorted(set(MMA.findall(asm))),
                                wgmma_waits=sorted(set(map(int, WGMMA_WAITS.findall(asm)))),
                                magic_unpack=asm.count("0x43004300") + asm.count("0x64006400"),
                                maxnreg=int(m.group(1)) if (m := MAXNREG.search(asm)) else None))
    return results


if __name__ == "__main__":
    print(json.dumps(compile_all(sys.argv[1])))
