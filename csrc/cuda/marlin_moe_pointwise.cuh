// The pointwise stages around the GEMMs: the activation between them (fp32 GEMM 1 sums -> the
// GEMM-2 input in the activation dtype) and the rounding of GEMM 2's fp32 token sums. The fused
// epilogues of marlin_moe_gemm.cuh apply the device functions; the two kernels are the same stages
// as launches of their own (the layer without fused epilogues).
// kIsEP: routes whose expert lives on another rank were never computed; the activation kernel skips
// them, and with kIsEP false the check is not compiled at all.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hal_marlin {

enum Activation : int { kSilu = 0, kSwigluOai = 1, kRelu2 = 2 };

__device__ __forceinline__ float silu(float v) { return __fdividef(v, 1.f + __expf(-v)); }

// Gated activations take (gate, up) of one intermediate column; relu2 takes its one value as gate.
__device__ __forceinline__ float activate(int activation, float gate, float up, float alpha, float limit) {
  if (activation == kSilu) return silu(gate) * up;
  if (activation == kSwigluOai) {
    const float g = fminf(gate, limit);
    const float u = fminf(fmaxf(up, -limit), limit);
    return __fdividef(g, 1.f + __expf(-alpha * g)) * (u + 1.f);
  }
  const float r = fmaxf(gate, 0.f);
  return r * r;
}

template <typename T>
__device__ __forceinline__ T to_dtype(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 to_dtype<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half to_dtype<__half>(float v) {
  return __float2half_rn(v);
}

// Loads 4 consecutive fp32 values summed over the K-split partials of GEMM 1.
__device__ __forceinline__ float4 load_summed(const float* p, int splits, size_t split_stride) {
  float4 sum = *reinterpret_cast<const float4*>(p);
  for (int s = 1; s < splits; ++s) {
    const float4 v = *reinterpret_cast<const float4*>(p + s * split_stride);
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  return sum;
}

// c1: [splits][routes][w13_rows] fp32 partials, gate and up interleaved by 16 (gate_up_columns in
// backends/marlin/repack.py) -> a2: [routes][inter]; 4 outputs per thread. The same grid also
// zeroes GEMM 2's fp32 accumulator (`zero`, `zero_count` floats, a multiple of 4), which saves a
// memset launch: GEMM 2 runs after this kernel on the same stream.
template <typename T, bool kIsEP>
__global__ void moe_activation(const float* __restrict__ c1, int splits, T* __restrict__ a2,
                               const int* __restrict__ route_expert, int routes, int inter,
                               int activation, float alpha, float limit, float* __restrict__ zero,
                               long long zero_count) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  for (long long i = first; i < zero_count / 4; i += stride)
    reinterpret_cast<float4*>(zero)[i] = make_float4(0.f, 0.f, 0.f, 0.f);

  const int quads = inter / 4;
  const bool gated = activation != kRelu2;
  const int width = gated ? 2 * inter : inter;
  const size_t split_stride = static_cast<size_t>(routes) * width;
  const long long total = static_cast<long long>(routes) * quads;
  for (long long idx = first; idx < total; idx += stride) {
    const int route = static_cast<int>(idx / quads);
    const int i = static_cast<int>(idx % quads) * 4;
    if constexpr (kIsEP) {
      if (route_expert[route] < 0) continue;
    }
    const float* row = c1 + static_cast<size_t>(route) * width;
    const int col = gated ? (i / 16) * 32 + i % 16 : i;  // the 4 gates (or values) of outputs i..i+3
    const float4 gate = load_summed(row + col, splits, split_stride);
    const float4 up = gated ? load_summed(row + col + 16, splits, split_stride) : make_float4(0.f, 0.f, 0.f, 0.f);
    T* dst = a2 + static_cast<size_t>(route) * inter + i;
    dst[0] = to_dtype<T>(activate(activation, gate.x, up.x, alpha, limit));
    dst[1] = to_dtype<T>(activate(activation, gate.y, up.y, alpha, limit));
    dst[2] = to_dtype<T>(activate(activation, gate.z, up.z, alpha, limit));
    dst[3] = to_dtype<T>(activate(activation, gate.w, up.w, alpha, limit));
  }
}

// GEMM 2 accumulated every route's weighted output into its token's fp32 row; tokens whose
// experts all live on other ranks kept the zeros. Rounds to the activation dtype, 4 per thread.
template <typename T>
__global__ void moe_to_dtype(const float* __restrict__ acc, T* __restrict__ out, long long count) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < count / 4;
       i += stride) {
    const float4 v = reinterpret_cast<const float4*>(acc)[i];
    T* dst = out + 4 * i;
    dst[0] = to_dtype<T>(v.x);
    dst[1] = to_dtype<T>(v.y);
    dst[2] = to_dtype<T>(v.z);
    dst[3] = to_dtype<T>(v.w);
  }
}

}  // namespace hal_marlin
