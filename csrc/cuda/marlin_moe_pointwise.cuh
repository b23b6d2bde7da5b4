// The two pointwise stages around the GEMMs: the activation between them (fp32 GEMM 1 partials ->
// activation dtype GEMM 2 input) and the final rounding of the fp32 token sums.
// kIsEP: routes whose expert lives on another rank were never computed; the activation skips
// them, and with kIsEP false the check is not compiled at all.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace hal_marlin {

enum Activation : int { kSilu = 0, kSwigluOai = 1, kRelu2 = 2 };

__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

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

// c1: [splits][routes][w13_rows] fp32 partials -> a2: [routes][inter]; 4 outputs per thread.
// The same grid also zeroes GEMM 2's fp32 accumulator (`zero`, `zero_count` floats, a multiple
// of 4), which saves a memset launch: GEMM 2 runs after this kernel on the same stream.
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
  const int width = activation == kRelu2 ? inter : 2 * inter;
  const size_t split_stride = static_cast<size_t>(routes) * width;
  const long long total = static_cast<long long>(routes) * quads;
  for (long long idx = first; idx < total; idx += stride) {
    const int route = static_cast<int>(idx / quads);
    const int i = static_cast<int>(idx % quads) * 4;
    if constexpr (kIsEP) {
      if (route_expert[route] < 0) continue;
    }
    const float* row = c1 + static_cast<size_t>(route) * width;
    float out[4];
    if (activation == kSilu) {
      const float4 gate = load_summed(row + i, splits, split_stride);
      const float4 up = load_summed(row + inter + i, splits, split_stride);
      out[0] = silu(gate.x) * up.x;
      out[1] = silu(gate.y) * up.y;
      out[2] = silu(gate.z) * up.z;
      out[3] = silu(gate.w) * up.w;
    } else if (activation == kSwigluOai) {
      const float4 lo = load_summed(row + 2 * i, splits, split_stride);
      const float4 hi = load_summed(row + 2 * i + 4, splits, split_stride);
      const float gate[4] = {lo.x, lo.z, hi.x, hi.z};
      const float up[4] = {lo.y, lo.w, hi.y, hi.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float g = fminf(gate[q], limit);
        const float u = fminf(fmaxf(up[q], -limit), limit);
        out[q] = g / (1.f + __expf(-alpha * g)) * (u + 1.f);
      }
    } else {
      const float4 h = load_summed(row + i, splits, split_stride);
      const float r[4] = {fmaxf(h.x, 0.f), fmaxf(h.y, 0.f), fmaxf(h.z, 0.f), fmaxf(h.w, 0.f)};
#pragma unroll
      for (int q = 0; q < 4; ++q) out[q] = r[q] * r[q];
    }
    T* dst = a2 + static_cast<size_t>(route) * inter + i;
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = to_dtype<T>(out[q]);
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
