"""Build vLLM's Marlin MoE GEMM (csrc/moe/marlin_moe_wna16), its moe_align_block_size and its GPTQ
repack kernel from a vLLM source tree into one torch-free shared library with a small C binding,
for the side-by-side benchmark `benchmarks/marlin_peer.py`. Nothing of vLLM is copied into this
repository: the sources are read from --vllm at build time.

    python benchmarks/marlin_peer_build.py --vllm /path/to/vllm-0.33.0 --out .peer/marlin/build

Only the kernels the benchmark times are instantiated: bf16 activations x uint4b8 weights x group
128 (vLLM's generate_kernels.py selection for that type: 15 Marlin instantiations, block sizes 8 to
64), each in its own translation unit so `--jobs` builds them in parallel.

The C entry points (all asynchronous on the given stream, 0 on success):
  hal_peer_gemm       vLLM's marlin_mm for bf16 x uint4b8 (its own config choice: thread_k/n -1)
  hal_peer_align      vLLM's moe_align_block_size (its small-batch or two-kernel path)
  hal_peer_repack     vLLM's gptq_marlin_repack kernel for one expert (4-bit)
  hal_peer_act_mul    act(gate) * up over [rows, 2n] -> [rows, n], one launch: silu on [gate | up]
                      (vLLM's silu_and_mul) or swiglu_oai on interleaved (gate, up) pairs, clamped,
                      alpha-scaled, times up + 1 (vLLM's swigluoai_and_mul)
  hal_peer_moe_sum    sum over top-k of [tokens, k, h] bf16 -> [tokens, h], skipping routes to
                      non-local experts (vLLM's pad-aware moe_sum math), one launch
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

LIBRARY = "libhal_peer_vllm_marlin.so"

# vLLM's generate_kernels.py: THREAD_CONFIGS (thread_k, thread_n, threads) x THREAD_M_BLOCKS, where
# 256-thread configs keep only (128, 128) for m_blocks <= 1 and (64, 256) above; stages 4.
THREAD_CONFIGS = ((128, 128, 256), (64, 256, 256), (64, 128, 128), (128, 64, 128))
THREAD_M_BLOCKS = (0.5, 1, 2, 3, 4)
GROUP_BLOCKS = 8  # group 128 / 16
STAGES = 4

COPIED = (
    "csrc/moe/marlin_moe_wna16/kernel.h",
    "csrc/moe/marlin_moe_wna16/marlin_template.h",
    "csrc/moe/marlin_moe_wna16/ops.cu",
    "csrc/moe/moe_align_sum_kernels.cu",
    "csrc/quantization/marlin/marlin.cuh",
    "csrc/quantization/marlin/marlin_dtypes.cuh",
    "csrc/quantization/marlin/marlin_mma.h",
    "csrc/quantization/marlin/dequant.h",
    "csrc/quantization/marlin/gptq_marlin_repack.cu",
    "csrc/core/scalar_type.hpp",
    "csrc/core/cuda_compat.h",
)

# The one torch header the kernels' headers include: its check macro, as an exception.
EXCEPTION_SHIM = """#pragma once
#include <stdexcept>
#define STD_TORCH_CHECK(cond, ...) \\
  do { if (!(cond)) throw std::runtime_error("check failed: " #cond); } while (0)
"""

TYPES = "vllm::kBFloat16.id(), vllm::kU4B8.id(), vllm::kBFloat16.id(), vllm::kBFloat16.id()"


def instantiations():
    """(threads, thread_m_blocks, thread_n_blocks, thread_k_blocks, m_block_size_8) as vLLM's
    generator selects them for one type."""
    out = []
    for m_blocks in THREAD_M_BLOCKS:
        for thread_k, thread_n, threads in THREAD_CONFIGS:
            if threads == 256:
                if m_blocks <= 1 and (thread_k, thread_n) != (128, 128):
                    continue
                if m_blocks > 1 and (thread_k, thread_n) != (64, 256):
                    continue
            out.append((threads, max(int(m_blocks), 1), thread_n // 16, thread_k // 16,
                        m_blocks == 0.5))
    return out


def _template_args(inst) -> str:
    threads, m, n, k, m8 = inst
    return (f"{TYPES}, {threads}, {m}, {n}, {k}, {'true' if m8 else 'false'}, {STAGES}, "
            f"{GROUP_BLOCKS}, false")


def kernel_unit(inst) -> str:
    return ('#include "kernel.h"\n#include "marlin_template.h"\n'
            "namespace MARLIN_NAMESPACE_NAME {\n"
            f"template __global__ void Marlin<{_template_args(inst)}>(MARLIN_KERNEL_PARAMS);\n}}\n")


def kernel_selector() -> str:
    lines = []
    for i, inst in enumerate(instantiations()):
        threads, m, n, k, m8 = inst
        cond = (f"a_type == vllm::kBFloat16 && b_type == vllm::kU4B8 && c_type == vllm::kBFloat16 && "
                f"s_type == vllm::kBFloat16 && threads == {threads} && thread_m_blocks == {m} && "
                f"thread_n_blocks == {n} && thread_k_blocks == {k} && m_block_size_8 == "
                f"{'true' if m8 else 'false'} && stages == {STAGES} && group_blocks == "
                f"{GROUP_BLOCKS} && is_zp_float == false")
        lines.append(f"{'if' if i == 0 else 'else if'} ({cond})\n  kernel = "
                     f"Marlin<{_template_args(inst)}>;")
    return "\n".join(lines) + "\n"


GEMM_BINDING = r"""
extern "C" int hal_peer_gemm(const void* a, const void* b, void* c, void* c_tmp, const void* bias,
                             const void* scales, void* workspace, const void* sorted_ids,
                             const void* expert_ids, const void* num_post_pad,
                             const void* topk_weights, int moe_block_size, int num_experts,
                             int top_k, int mul_topk_weights, int size_m, int size_n, int size_k,
                             int group_size, int sms, int thread_k, int thread_n,
                             int blocks_per_sm, void* stream) {
  try {
    int dev = 0;
    cudaGetDevice(&dev);
    MARLIN_NAMESPACE_NAME::marlin_mm(
        a, b, c, c_tmp, const_cast<void*>(bias), nullptr, const_cast<void*>(scales), nullptr,
        nullptr, const_cast<void*>(sorted_ids), const_cast<void*>(expert_ids),
        const_cast<void*>(num_post_pad), const_cast<void*>(topk_weights), moe_block_size,
        num_experts, top_k, mul_topk_weights != 0, size_m, size_n, size_k, workspace,
        vllm::kBFloat16, vllm::kU4B8, vllm::kBFloat16, vllm::kBFloat16, bias != nullptr, false,
        group_size, dev, static_cast<cudaStream_t>(stream), thread_k, thread_n, sms,
        blocks_per_sm, false, true, false);
  } catch (const std::exception& e) {
    fprintf(stderr, "hal_peer_gemm: %s\n", e.what());
    return 1;
  }
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 2;
}
"""

ALIGN_HEAD = r"""#include <cub/cub.cuh>
#include <cuda_runtime.h>
#include <cstdint>
#include <algorithm>
#include "core/cuda_compat.h"
#define CEILDIV(x, y) (((x) + (y) - 1) / (y))
namespace vllm {
namespace moe {
"""

# moe_align_block_size's host logic for int32 ids, as vLLM 0.33.0 launches it.
ALIGN_BINDING = r"""
}  // namespace moe
}  // namespace vllm

extern "C" int hal_peer_align(const int32_t* topk_ids, int numel, int top_k, int num_experts,
                              int block_size, int32_t* sorted_ids, int max_num_tokens_padded,
                              int32_t* expert_ids, int32_t* num_post_pad, int32_t* expert_map,
                              int32_t* cumsum_buffer, void* stream_) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  int padded_num_experts = ((num_experts + WARP_SIZE - 1) / WARP_SIZE) * WARP_SIZE;
  int experts_per_warp = WARP_SIZE;
  int threads = 1024;
  if (padded_num_experts >= 1024) return 3;
  bool has_expert_map = expert_map != nullptr;
  bool small_batch_expert_mode = (numel < 1024) && (num_experts <= 64);
  if (small_batch_expert_mode) {
    const int32_t th = std::max((int32_t)num_experts, WARP_SIZE);
    const int32_t shared_mem_size = ((th + 1) * num_experts + (num_experts + 1)) * sizeof(int32_t);
    constexpr int32_t fill_threads = 256;
    vllm::moe::moe_align_block_size_small_batch_expert_kernel<int32_t, fill_threads>
        <<<1, fill_threads + th, shared_mem_size, stream>>>(
            topk_ids, sorted_ids, expert_ids, num_post_pad, expert_map, num_experts, block_size,
            numel, max_num_tokens_padded, top_k, has_expert_map, nullptr);
  } else {
    size_t num_warps = CEILDIV(padded_num_experts, experts_per_warp);
    size_t shared_mem_size = num_warps * experts_per_warp * sizeof(int32_t);
    vllm::moe::moe_align_block_size_kernel<int32_t><<<2, threads, shared_mem_size, stream>>>(
        topk_ids, sorted_ids, expert_ids, num_post_pad, expert_map, num_experts,
        padded_num_experts, experts_per_warp, block_size, numel, cumsum_buffer,
        max_num_tokens_padded, top_k, has_expert_map);
    const int block_threads = std::min(256, threads);
    const int num_blocks = (numel + block_threads - 1) / block_threads;
    dim3 grid(1, std::min(num_blocks, 65535));
    vllm::moe::count_and_sort_expert_tokens_kernel<int32_t><<<grid, block_threads, 0, stream>>>(
        topk_ids, sorted_ids, cumsum_buffer, expert_map, numel, num_experts,
        max_num_tokens_padded, top_k, has_expert_map, nullptr);
  }
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 2;
}
"""

REPACK_BINDING = r"""
extern "C" int hal_peer_repack(const uint32_t* qweight, uint32_t* out, int size_k, int size_n,
                               void* stream_) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_);
  int dev = 0, blocks = 0, max_shared_mem = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&blocks, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&max_shared_mem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  auto kernel = marlin::gptq_marlin_repack_kernel<marlin::repack_threads, 4, false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared_mem);
  kernel<<<blocks, marlin::repack_threads, max_shared_mem, stream>>>(qweight, out, size_k, size_n);
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 2;
}
"""

# The glue between the two GEMMs and after the second: one launch each, 16-byte accesses.
GLUE = r"""#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {

struct alignas(16) Bf16x8 { __nv_bfloat16 v[8]; };

__device__ __forceinline__ float act_mul(float gate, float up, int kind, float alpha, float limit) {
  if (kind == 1) {  // swiglu_oai
    gate = fminf(gate, limit);
    up = fmaxf(fminf(up, limit), -limit);
    return gate / (1.f + __expf(-alpha * gate)) * (up + 1.f);
  }
  return gate / (1.f + __expf(-gate)) * up;  // silu(gate) * up
}

__global__ void act_mul_kernel(const __nv_bfloat16* __restrict__ in, __nv_bfloat16* __restrict__ out,
                               int64_t rows, int n, int kind, float alpha, float limit) {
  const int vecs = n / 8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * vecs;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / vecs;
    int c = (int)(i % vecs) * 8;
    float gate[8], up[8];
    if (kind == 1) {  // gate and up interleaved: (gate, up) pairs along the row
      Bf16x8 lo = *reinterpret_cast<const Bf16x8*>(in + r * 2 * n + 2 * c);
      Bf16x8 hi = *reinterpret_cast<const Bf16x8*>(in + r * 2 * n + 2 * c + 8);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        gate[j] = __bfloat162float(lo.v[2 * j]);
        up[j] = __bfloat162float(lo.v[2 * j + 1]);
        gate[j + 4] = __bfloat162float(hi.v[2 * j]);
        up[j + 4] = __bfloat162float(hi.v[2 * j + 1]);
      }
    } else {  // gate in the first half of the row, up in the second
      Bf16x8 g = *reinterpret_cast<const Bf16x8*>(in + r * 2 * n + c);
      Bf16x8 u = *reinterpret_cast<const Bf16x8*>(in + r * 2 * n + n + c);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        gate[j] = __bfloat162float(g.v[j]);
        up[j] = __bfloat162float(u.v[j]);
      }
    }
    Bf16x8 o;
#pragma unroll
    for (int j = 0; j < 8; ++j) o.v[j] = __float2bfloat16(act_mul(gate[j], up[j], kind, alpha, limit));
    *reinterpret_cast<Bf16x8*>(out + r * n + c) = o;
  }
}

__global__ void moe_sum_kernel(const __nv_bfloat16* __restrict__ in, __nv_bfloat16* __restrict__ out,
                               const int32_t* __restrict__ topk_ids,
                               const int32_t* __restrict__ expert_map, int64_t tokens, int top_k,
                               int h) {
  const int vecs = h / 8;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < tokens * vecs;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = i / vecs;
    int c = (int)(i % vecs) * 8;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < top_k; ++k) {
      int e = topk_ids[t * top_k + k];
      if (e < 0 || (expert_map != nullptr && expert_map[e] < 0)) continue;
      Bf16x8 x = *reinterpret_cast<const Bf16x8*>(in + (t * top_k + k) * h + c);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += __bfloat162float(x.v[j]);
    }
    Bf16x8 o;
#pragma unroll
    for (int j = 0; j < 8; ++j) o.v[j] = __float2bfloat16(acc[j]);
    *reinterpret_cast<Bf16x8*>(out + t * h + c) = o;
  }
}

int grid_for(int64_t work) {
  int64_t blocks = (work + 255) / 256;
  return (int)(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

extern "C" int hal_peer_act_mul(const void* in, void* out, int64_t rows, int n, int kind,
                                float alpha, float limit, void* stream) {
  if (n % 8) return 3;
  act_mul_kernel<<<grid_for(rows * (n / 8)), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(in), static_cast<__nv_bfloat16*>(out), rows, n, kind,
      alpha, limit);
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 2;
}

extern "C" int hal_peer_moe_sum(const void* in, void* out, const int32_t* topk_ids,
                                const int32_t* expert_map, int64_t tokens, int top_k, int h,
                                void* stream) {
  if (h % 8) return 3;
  moe_sum_kernel<<<grid_for(tokens * (h / 8)), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(in), static_cast<__nv_bfloat16*>(out), topk_ids,
      expert_map, tokens, top_k, h);
  return cudaPeekAtLastError() == cudaSuccess ? 0 : 2;
}
"""


def _between(text: str, start: str, end: str, name: str) -> str:
    i = text.find(start)
    j = text.find(end, i + 1)
    if i < 0 or j < 0:
        raise SystemExit(f"{name}: the expected code was not found (start {start[:40]!r})")
    return text[i:j]


def _strip_torch_includes(text: str) -> str:
    return re.sub(r'#include\s+(<torch/[^>]*>|"torch_utils.h")\n', "", text)


def _write(path: Path, text: str) -> None:
    """Write only what changed, so a rebuild compiles only the units whose text changed."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def write_sources(vllm: Path, src: Path, gen: Path) -> list:
    """Copy the vLLM files the build reads into `src` (its csrc layout) and write the generated
    units into `gen`; returns the .cu files to compile."""
    for rel in COPIED:
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        _write(dst, (vllm / rel).read_text())
    csrc = src / "csrc"
    (gen / "torch/headeronly/util").mkdir(parents=True, exist_ok=True)
    _write(gen / "torch/headeronly/util/Exception.h", EXCEPTION_SHIM)
    units = []
    for inst in instantiations():
        threads, m, n, k, m8 = inst
        path = gen / f"marlin_t{threads}_m{m}{'h' if m8 else ''}_n{n}_k{k}.cu"
        _write(path, kernel_unit(inst))
        units.append(path)
    _write(gen / "kernel_selector.h", kernel_selector())
    ops = (csrc / "moe/marlin_moe_wna16/ops.cu").read_text()
    ops = ops[: ops.index("torch::stable::Tensor moe_wna16_marlin_gemm(")]
    ops = '#include <cstdio>\n#include <stdexcept>\n' + _strip_torch_includes(ops)
    _write(gen / "peer_gemm.cu", ops + GEMM_BINDING)
    units.append(gen / "peer_gemm.cu")
    align = (csrc / "moe/moe_align_sum_kernels.cu").read_text()
    body = _between(align, "template <typename scalar_t>\n__device__ __forceinline__ int get_local_expert_id",
                    "// Reduce the topk expert outputs", "moe_align_sum_kernels.cu")
    small = _between(align, "template <typename scalar_t, int32_t fill_threads>\n__global__ void "
                     "moe_align_block_size_small_batch_expert_kernel(", "\n}\n",
                     "moe_align_sum_kernels.cu") + "\n}\n"
    _write(gen / "peer_align.cu", ALIGN_HEAD + body + small + ALIGN_BINDING)
    units.append(gen / "peer_align.cu")
    repack = (csrc / "quantization/marlin/gptq_marlin_repack.cu").read_text()
    kernel = _between(repack, "namespace marlin {", "}  // namespace marlin", "gptq_marlin_repack.cu")
    _write(gen / "peer_repack.cu", '#include "marlin.cuh"\n#include <cstdint>\n' + kernel
                                        + "}  // namespace marlin\n" + REPACK_BINDING)
    units.append(gen / "peer_repack.cu")
    _write(gen / "peer_glue.cu", GLUE)
    units.append(gen / "peer_glue.cu")
    return units


def nvcc_flags(src: Path, gen: Path, arch: str) -> list:
    csrc = src / "csrc"
    # The GEMM unit launches Marlin instantiations defined in the other units.
    return ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-static-global-template-stub=false",
            "-Xcompiler", "-fPIC",
            "-gencode", f"arch=compute_{arch},code=sm_{arch}", "-DMARLIN_NAMESPACE_NAME=marlin_moe_wna16",
            f"-I{gen}", f"-I{csrc}", f"-I{csrc / 'moe/marlin_moe_wna16'}",
            f"-I{csrc / 'quantization/marlin'}"]


def build(vllm: Path, out: Path, arch: str, jobs: int, nvcc: str) -> Path:
    src, gen, obj = out / "src", out / "gen", out / "obj"
    for d in (gen, obj):
        d.mkdir(parents=True, exist_ok=True)
    units = write_sources(vllm, src, gen)
    flags = nvcc_flags(src, gen, arch)

    def compile_one(unit: Path):
        o = obj / (unit.stem + ".o")
        if o.exists() and o.stat().st_mtime >= unit.stat().st_mtime:
            return o
        # The repack unit keeps vLLM's own namespace for marlin.cuh's constants.
        extra = ["-UMARLIN_NAMESPACE_NAME"] if unit.stem == "peer_repack" else []
        start = time.time()
        r = subprocess.run([nvcc, *flags, *extra, "-c", str(unit), "-o", str(o)],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"nvcc {unit.name} failed:\n{r.stderr[-4000:]}")
        print(f"[peer build] {unit.name} {time.time() - start:.1f} s", flush=True)
        return o

    # The slowest units (the GEMM instantiations, the largest tiles) first.
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        objects = list(pool.map(compile_one, units))
    lib = out / LIBRARY
    r = subprocess.run([nvcc, "-shared", "-o", str(lib), *map(str, objects)], capture_output=True,
                       text=True)
    if r.returncode:
        raise RuntimeError(f"link failed:\n{r.stderr[-4000:]}")
    return lib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", required=True, type=Path, help="vLLM source tree (holds csrc/)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--arch", default="90", help="compute capability digits, e.g. 90")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", "16")))
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    args = parser.parse_args()
    start = time.time()
    lib = build(args.vllm, args.out, args.arch, args.jobs, args.nvcc)
    print(f"[peer build] {lib} ({lib.stat().st_size / 2**20:.1f} MiB) in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
