// AVX2/FMA/F16C weight decoders and TinyGEMM micro-kernel, for CPUs without AVX-512-BF16 (AMD Zen
// 2/3, Intel before Cooper Lake).
//
// There is no bf16 dot product here, so the kernel works in fp32 in the packed VNNI order itself:
// a decoder turns 8 columns of one K pair row into two vectors of (k even, k odd) lane pairs, the
// activations are broadcast as the matching (a[k], a[k+1]) pair, and each column's two lanes are
// added once at the end of the tile. That avoids splitting even and odd k on every weight.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "moe_activation.h"
#include "moe_scratch.h"

// No bf16 conversion instructions here, and oneDNN's bf16 BRGEMM ukernel needs AVX-512: this ISA
// runs every block on TinyGEMM, and the forced 'brgemm' policy is refused for it.
#define HAL_MOE_ISA_HAS_BRGEMM 0

namespace hal_moe {
namespace isa {

constexpr const char* kName = "avx2";
constexpr int kMaxTileRows = 4;  // 4 rows x 2 accumulators + 2 weight vectors of 16 ymm

struct Octet {
  __m256 lo, hi;  // columns 0-3 and 4-7 of the octet, each as (k even, k odd) lane pairs
};

struct Bf16Panel {
  static constexpr int64_t kGroupPairs = INT64_MAX;
  static constexpr bool kScalesActivations = false;
  const uint16_t* w;  // [K/2][32][2]
  void begin_group(int64_t) {}
  Octet octet(int64_t kp, int o) const {
    const uint16_t* p = w + kp * 64 + o * 16;
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16)),
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16))};
  }
};

// 16 e4m3 bytes -> the two halves of an octet, each value as fp32 times 2^-8 (the bias difference,
// folded back into the block scale). The sign-extended byte shifted left by 7 puts the 7 magnitude
// bits into fp16's exponent/mantissa fields and the sign into bits 15 and 14; bit 14 is then
// replaced by the carry of adding 1 to the magnitude, set for 0x7f only, which makes NaN fp16
// 0x7f80 (torch's float8_e4m3fn -> float NaN bits once widened) where 480 would be. F16C's convert
// takes fp16 subnormals exactly: zero and e4m3 subnormals decode exactly. Widening the 16 bytes in
// one register pays for the NaN's two instructions: eight per 16 weights, as many as two unpacks,
// shifts and masks took.
inline Octet e4m3_to_fp32(__m128i bytes) {
  const __m256i a = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
  // a ^ ((a + 0x80) & 0x4000): bit 14 of a xor bit 14 of a + 0x80 is the carry out of the magnitude
  const __m256i h = _mm256_xor_si256(
      a, _mm256_and_si256(_mm256_add_epi16(a, _mm256_set1_epi16(0x80)), _mm256_set1_epi16(0x4000)));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}

// The block scale is one number per 128 K rows, so the kernel multiplies the broadcast activation
// pair by it (one multiply per row) instead of every weight vector.
struct Fp8Panel {
  static constexpr int64_t kGroupPairs = 64;  // 128 K rows share one block scale
  static constexpr bool kScalesActivations = true;
  static constexpr float kBiasFix = 256.f;
  const uint8_t* w;    // [K/2][32][2]
  const float* scale;  // [ceil(K/128)]
  __m256 s;
  void begin_group(int64_t g) { s = _mm256_set1_ps(scale[g] * kBiasFix); }
  Octet octet(int64_t kp, int o) const {
    return e4m3_to_fp32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + kp * 64 + o * 16)));
  }
};

// e2m1 -> fp16 through a byte table: every e2m1 value is an fp16 whose low byte is zero, so one
// pshufb gives the high byte. One packed byte is the (k even, k odd) pair of one column.
struct Mxfp4Panel {
  static constexpr int64_t kGroupPairs = 16;  // 32 K rows share one e8m0 scale per column
  static constexpr bool kScalesActivations = false;
  const uint8_t* w;      // [K/2][32], low nibble = even k
  const uint8_t* scale;  // [K/32][32] e8m0
  __m256 s[4][2];        // per octet: column scales, each twice (k even, k odd), columns 0-3 | 4-7
  void begin_group(int64_t g) {
    const __m256i dup_lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i dup_hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    for (int o = 0; o < 4; ++o) {
      const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scale + g * 32 + o * 8));
      // e8m0 -> fp32 exponent field; e = 0 (2^-127) reads as 0.
      const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu8_epi32(e), 23));
      s[o][0] = _mm256_permutevar8x32_ps(f, dup_lo);
      s[o][1] = _mm256_permutevar8x32_ps(f, dup_hi);
    }
  }
  Octet octet(int64_t kp, int o) const {
    const __m128i fp16_high = _mm_setr_epi8(0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46,
                                            static_cast<char>(0x80), static_cast<char>(0xb8),
                                            static_cast<char>(0xbc), static_cast<char>(0xbe),
                                            static_cast<char>(0xc0), static_cast<char>(0xc2),
                                            static_cast<char>(0xc4), static_cast<char>(0xc6));
    const __m128i nibble = _mm_set1_epi8(0x0f);
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + kp * 32 + o * 8));
    const __m128i pairs = _mm_unpacklo_epi8(_mm_and_si128(b, nibble),
                                            _mm_and_si128(_mm_srli_epi16(b, 4), nibble));
    const __m128i high = _mm_shuffle_epi8(fp16_high, pairs);
    const __m128i zero = _mm_setzero_si128();
    return {_mm256_mul_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(zero, high)), s[o][0]),
            _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(zero, high)), s[o][1])};
  }
};

// A panel already decoded to fp32 in the kernel's own order ([K/2][4 octets][lo, hi]), for blocks
// of more rows than one tile: decoding once beats decoding again for every tile of rows.
struct F32Panel {
  static constexpr int64_t kGroupPairs = INT64_MAX;
  static constexpr bool kScalesActivations = false;
  const float* w;
  void begin_group(int64_t) {}
  Octet octet(int64_t kp, int o) const {
    return {_mm256_loadu_ps(w + kp * 64 + o * 16), _mm256_loadu_ps(w + kp * 64 + o * 16 + 8)};
  }
};

template <class Panel>
inline void decode_panel_f32(Panel panel, int64_t kpairs, float* out) {
  for (int64_t g0 = 0; g0 < kpairs; g0 += Panel::kGroupPairs) {
    panel.begin_group(g0 / Panel::kGroupPairs);
    const int64_t g1 = kpairs - g0 < Panel::kGroupPairs ? kpairs : g0 + Panel::kGroupPairs;
    for (int64_t kp = g0; kp < g1; ++kp) {
      for (int o = 0; o < 4; ++o) {
        Octet b = panel.octet(kp, o);
        if constexpr (Panel::kScalesActivations) {
          b.lo = _mm256_mul_ps(b.lo, panel.s);
          b.hi = _mm256_mul_ps(b.hi, panel.s);
        }
        _mm256_storeu_ps(out + kp * 64 + o * 16, b.lo);
        _mm256_storeu_ps(out + kp * 64 + o * 16 + 8, b.hi);
      }
    }
  }
}

// Rows x Octets x 8 columns starting at octet o0; `a` holds the rows in fp32, so a (a[k], a[k+1])
// pair broadcast is one 64-bit load. One or two rows take all octets of a pair row in one pass, so
// each 64-byte line of the panel is consumed whole while it streams in.
template <int Rows, int Octets, class Panel>
inline void tiny_tile(const float* a, int64_t lda, Panel panel, int64_t kpairs, int o0, float* c,
                      int64_t ldc) {
  __m256 acc[Rows][Octets][2];
  for (int r = 0; r < Rows; ++r) {
    for (int o = 0; o < Octets; ++o) acc[r][o][0] = acc[r][o][1] = _mm256_setzero_ps();
  }
  for (int64_t g0 = 0; g0 < kpairs; g0 += Panel::kGroupPairs) {
    panel.begin_group(g0 / Panel::kGroupPairs);
    const int64_t g1 = kpairs - g0 < Panel::kGroupPairs ? kpairs : g0 + Panel::kGroupPairs;
    for (int64_t kp = g0; kp < g1; ++kp) {
      Octet b[Octets];
      for (int o = 0; o < Octets; ++o) b[o] = panel.octet(kp, o0 + o);
      for (int r = 0; r < Rows; ++r) {
        __m256 av = _mm256_castpd_ps(
            _mm256_broadcast_sd(reinterpret_cast<const double*>(a + r * lda + 2 * kp)));
        if constexpr (Panel::kScalesActivations) av = _mm256_mul_ps(av, panel.s);
        for (int o = 0; o < Octets; ++o) {
          acc[r][o][0] = _mm256_fmadd_ps(av, b[o].lo, acc[r][o][0]);
          acc[r][o][1] = _mm256_fmadd_ps(av, b[o].hi, acc[r][o][1]);
        }
      }
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int o = 0; o < Octets; ++o) {
      // hadd gives columns (0 1 4 5 | 2 3 6 7); the 64-bit permute puts them in order.
      const __m256 sums = _mm256_hadd_ps(acc[r][o][0], acc[r][o][1]);
      _mm256_storeu_ps(c + r * ldc + (o0 + o) * 8,
                       _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(sums), 0xd8)));
    }
  }
}

// c[rows][32] (row stride ldc) = a[rows][K] x panel, over tiles of at most kMaxTileRows rows.
template <class Panel>
inline void tiny_tiles(const float* af, int64_t k, int64_t rows, const Panel& panel, int64_t kpairs,
                       float* c, int64_t ldc) {
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxTileRows) {
    const float* ar = af + r0 * k;
    float* cr = c + r0 * ldc;
    switch (rows - r0 < kMaxTileRows ? rows - r0 : kMaxTileRows) {
      case 1: tiny_tile<1, 4>(ar, k, panel, kpairs, 0, cr, ldc); break;
      case 2:
        tiny_tile<2, 2>(ar, k, panel, kpairs, 0, cr, ldc);
        tiny_tile<2, 2>(ar, k, panel, kpairs, 2, cr, ldc);
        break;
      case 3:
        for (int o = 0; o < 4; ++o) tiny_tile<3, 1>(ar, k, panel, kpairs, o, cr, ldc);
        break;
      default:
        for (int o = 0; o < 4; ++o) tiny_tile<4, 1>(ar, k, panel, kpairs, o, cr, ldc);
        break;
    }
  }
}

// tiny_gemm's buffers, kept per thread: the block's activations in fp32, and the panel decoded to
// fp32 for a block of more rows than one tile.
struct TinyScratch {
  AlignedBuffer<float> activations;
  AlignedBuffer<float> decoded;
};

// c[rows][32] (row stride ldc) = a[rows][K] x panel. A block of more than one tile of rows decodes
// the panel to fp32 once and runs every tile from that.
template <class Panel>
inline void tiny_gemm(const uint16_t* a, int64_t lda, int64_t rows, const Panel& panel,
                      int64_t kpairs, float* c, int64_t ldc, TinyScratch& scratch) {
  // The block's activations to fp32 once per call: every octet and row tile reads them again.
  const int64_t k = 2 * kpairs;
  float* const afp = scratch.activations.ensure(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; i += 8) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + r * lda + i));
      _mm256_storeu_ps(afp + r * k + i,
                       _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)));
    }
  }
  if (rows <= kMaxTileRows) {
    tiny_tiles(afp, k, rows, panel, kpairs, c, ldc);
    return;
  }
  float* const decoded = scratch.decoded.ensure(kpairs * 64);
  decode_panel_f32(panel, kpairs, decoded);
  tiny_tiles(afp, k, rows, F32Panel{decoded}, kpairs, c, ldc);
}

// The fp8 decoder's values at block scale 1, in the packed order: in registers as TinyGEMM reads
// them (times the 2^8 the kernel folds into the activations' scale), or decoded once for a large
// block. Tests hold them to torch.
inline void decode_fp8(const uint8_t* w, int64_t kpairs, bool dequantize, float* out) {
  const std::vector<float> ones(static_cast<size_t>((kpairs + Fp8Panel::kGroupPairs - 1) / Fp8Panel::kGroupPairs), 1.f);
  Fp8Panel panel{};
  panel.w = w;
  panel.scale = ones.data();
  if (dequantize) {
    decode_panel_f32(panel, kpairs, out);
    return;
  }
  const __m256 bias_fix = _mm256_set1_ps(Fp8Panel::kBiasFix);
  for (int64_t kp = 0; kp < kpairs; ++kp) {
    for (int o = 0; o < 4; ++o) {
      const Octet b = panel.octet(kp, o);
      _mm256_storeu_ps(out + kp * 64 + o * 16, _mm256_mul_ps(b.lo, bias_fix));
      _mm256_storeu_ps(out + kp * 64 + o * 16 + 8, _mm256_mul_ps(b.hi, bias_fix));
    }
  }
}

// Stage 1's activation per element: without a vector exp here, the scalar form is the fast one.
inline void activation_row(Activation act, const float* g, const float* u, const float* bg, const float* bu,
                           int64_t n, float alpha, float limit, uint16_t* dst) {
  activation_row_scalar(act, g, u, bg, bu, n, alpha, limit, dst);
}

}  // namespace isa
}  // namespace hal_moe
