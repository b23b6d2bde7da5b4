// Stage 1's activation of the fused MoE, per element in fp32, rounded to bf16 once. The AVX-512
// micro-kernels evaluate the same functions 16 columns at a time (moe_isa_avx512bf16.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace hal_moe {

// Same numbering as backends/cpu_brgemm/policy.py ACTIVATION_CODES.
enum class Activation : int64_t { kSilu = 0, kSwigluOai = 1, kRelu2 = 2 };

// h: gate (or the only) projection, u: up projection; bias already added.
inline float activate(Activation act, float h, float u, float alpha, float limit) {
  if (act == Activation::kRelu2) {
    h = h > 0.f ? h : 0.f;
    return h * h;
  }
  if (act == Activation::kSilu) return h / (1.f + std::exp(-h)) * u;
  const float gl = std::min(h, limit);
  const float ul = std::max(-limit, std::min(u, limit));
  return gl / (1.f + std::exp(-alpha * gl)) * (ul + 1.f);
}

// fp32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN), as c10::BFloat16 rounds.
inline uint16_t bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  if (std::isnan(v)) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// dst[c] = bf16(act(g[c] + bg[c], u[c] + bu[c])) for c < n; a null bias adds nothing, and relu2
// reads no u.
inline void activation_row_scalar(Activation act, const float* g, const float* u, const float* bg,
                                  const float* bu, int64_t n, float alpha, float limit, uint16_t* dst) {
  for (int64_t c = 0; c < n; ++c) {
    const float h = g[c] + (bg ? bg[c] : 0.f);
    const float uv = act == Activation::kRelu2 ? 0.f : u[c] + (bu ? bu[c] : 0.f);
    dst[c] = bf16_bits(activate(act, h, uv, alpha, limit));
  }
}

}  // namespace hal_moe
