// The pointwise math the GEMM epilogues apply: the activation between the GEMMs (GEMM 1's
// epilogue, on fp32 sums) and the rounding to the activation dtype (GEMM 1's output, and GEMM 2's
// fp32 token sums in its last arriving block).
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

}  // namespace hal_marlin
