// AVX-512-BF16 weight decoders and TinyGEMM micro-kernel (Sapphire Rapids and later, Zen 4).
//
// A packed weight panel holds 32 output columns in VNNI order: for each pair of K rows, 32 columns
// of (k even, k odd). A decoder turns one such pair row into two registers of 16 bf16 pairs, which
// is exactly what vdpbf16ps consumes against a broadcast (a[k], a[k+1]) pair of activations.
//
// Decoders produce the unscaled values, exactly (e4m3 and e2m1 values are all bf16 values), and the
// kernel applies each scale group to a partial accumulator: one FMA per group instead of a multiply
// per weight. Accumulator lanes are columns, so a per-column scale (mxfp4) is a plain vector.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "moe_activation.h"
#include "moe_scratch.h"

#define HAL_MOE_ISA_HAS_BRGEMM 1

#ifndef MOE_PREFETCH_BYTES
#error "MOE_PREFETCH_BYTES is set by backends/cpu_brgemm/policy.py"
#endif

namespace hal_moe {
namespace isa {

constexpr const char* kName = "avx512bf16";
constexpr int kMaxTileRows = 8;  // 8 rows x (2 accumulators + 2 partials) + 2 weight registers
constexpr int64_t kPrefetchBytes = MOE_PREFETCH_BYTES;

struct Bf16Panel {
  static constexpr bool kScaled = false;
  static constexpr int64_t kGroupPairs = INT64_MAX;
  static constexpr int64_t kPairBytes = 128;
  const uint16_t* w;  // [K/2][32][2]
  const char* data() const { return reinterpret_cast<const char*>(w); }
  void begin_group(int64_t) {}
  __m512 column_scale(int) const { return _mm512_set1_ps(1.f); }
  __m512i row(int64_t kp, int half) const {
    return _mm512_loadu_si512(w + kp * 64 + half * 32);
  }
};

// e4m3fn -> bf16 as bits, times 2^8 (folded back into the block scale): the sign-extended byte
// shifted left by 4 puts the 7 magnitude bits into bf16's low exponent and high mantissa bits, and
// one set exponent bit rebiases them (4-bit exponent e -> e + 128 = (e - 7) + 127 + 8), exact for
// every normal value. Zero, the 7 subnormal magnitudes (m x 2^-9, times 2^8 = m / 2) and NaN
// (magnitude 0x7f, which the formula would read as 480) come from a table indexed by the
// magnitude plus one: NaN carries out of the 7 bits to index 0, zero and the subnormals take 1-8,
// and the rest of exponent 1 (9-15, as the formula gives them) shares the index range; the sign
// goes on last. NaN decodes to torch's float8_e4m3fn -> float bits (0x7ff00000 and its sign).
// Seven instructions per 32 weights, three of them on the shuffle port.
struct Fp8Panel {
  static constexpr bool kScaled = true;
  static constexpr int64_t kGroupPairs = 64;  // 128 K rows share one block scale
  static constexpr int64_t kPairBytes = 64;   // one K pair row of 32 columns
  const uint8_t* w;     // [K/2][32][2]
  const float* scale;   // [ceil(K/128)]
  __m512 s;
  const char* data() const { return reinterpret_cast<const char*>(w); }
  void begin_group(int64_t g) { s = _mm512_set1_ps(scale[g] * (1.f / 256.f)); }
  __m512 column_scale(int) const { return s; }
  __m512i row(int64_t kp, int half) const {
    const __m512i table = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0x40e0, 0x40d0, 0x40c0, 0x40b0, 0x40a0, 0x4090, 0x4080,
        0x4060, 0x4040, 0x4020, 0x4000, 0x3fc0, 0x3f80, 0x3f00, 0, 0x7ff0);
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kp * 64 + half * 32));
    const __m512i x = _mm512_cvtepi8_epi16(bytes);
    // (x << 4) & 0x07f0 | 0x4000: magnitude under the rebiasing exponent bit
    const __m512i normal = _mm512_ternarylogic_epi32(_mm512_slli_epi16(x, 4), _mm512_set1_epi16(0x07f0),
                                                     _mm512_set1_epi16(0x4000), 0xEA);
    // Magnitude + 1 with bits 4-6 clear: magnitudes 0-14 (exponent 0 or 1) and 0x7f (NaN).
    const __m512i index = _mm512_add_epi16(x, _mm512_set1_epi16(1));
    const __mmask32 from_table = _mm512_testn_epi16_mask(index, _mm512_set1_epi16(0x70));
    const __m512i v = _mm512_mask_permutexvar_epi16(normal, from_table, index, table);
    // v | (x & 0x8000): the sign
    return _mm512_ternarylogic_epi32(v, x, _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);
  }
};

// One byte is one (k even, k odd) pair of one column: low nibble = even k, as checkpoints store it.
// b | b << 12 in a 32-bit lane puts the even nibble under the low 16-bit lane's index bits (bit 4,
// the odd nibble's low bit, selects the table's second copy) and the odd nibble under the high
// lane's; one vpermw then decodes both.
struct Mxfp4Panel {
  static constexpr bool kScaled = true;
  static constexpr int64_t kGroupPairs = 16;  // 32 K rows share one e8m0 scale per column
  static constexpr int64_t kPairBytes = 32;
  const uint8_t* w;       // [K/2][32]
  const uint8_t* scale;   // [K/32][32] e8m0
  __m512 s[2];            // per half: the 16 columns' scales
  const char* data() const { return reinterpret_cast<const char*>(w); }
  void begin_group(int64_t g) {
    for (int half = 0; half < 2; ++half) {
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + g * 32 + half * 16));
      // e8m0 -> fp32 by placing the byte in the exponent field; e = 0 (2^-127) reads as 0.
      s[half] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(e), 23));
    }
  }
  __m512 column_scale(int half) const { return s[half]; }
  __m512i row(int64_t kp, int half) const {
    // e2m1 code -> bf16, twice (index bit 4 is don't-care)
    const __m512i e2m1 = _mm512_set_epi16(
        static_cast<int16_t>(0xc0c0), static_cast<int16_t>(0xc080), static_cast<int16_t>(0xc040),
        static_cast<int16_t>(0xc000), static_cast<int16_t>(0xbfc0), static_cast<int16_t>(0xbf80),
        static_cast<int16_t>(0xbf00), static_cast<int16_t>(0x8000), 0x40c0, 0x4080, 0x4040, 0x4000, 0x3fc0,
        0x3f80, 0x3f00, 0,
        static_cast<int16_t>(0xc0c0), static_cast<int16_t>(0xc080), static_cast<int16_t>(0xc040),
        static_cast<int16_t>(0xc000), static_cast<int16_t>(0xbfc0), static_cast<int16_t>(0xbf80),
        static_cast<int16_t>(0xbf00), static_cast<int16_t>(0x8000), 0x40c0, 0x4080, 0x4040, 0x4000, 0x3fc0,
        0x3f80, 0x3f00, 0);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + kp * 32 + half * 16));
    const __m512i d = _mm512_cvtepu8_epi32(bytes);
    return _mm512_permutexvar_epi16(_mm512_or_si512(d, _mm512_slli_epi32(d, 12)), e2m1);
  }
};

// acc += scale * partial, once per scale group; the bf16 panel has a single unscaled group.
// With few rows, consecutive K pairs go to Chains independent partial sums, so vdpbf16ps issues
// back to back instead of waiting out its latency on one accumulator. At decode the panel streams
// from DRAM once: a software prefetch kPrefetchBytes ahead keeps the stream going across the 4 KiB
// pages where the hardware prefetcher stops (past the panel's end it touches the next panel, which
// is usually the next one read).
template <int Rows, int Chains, class Panel>
inline void tiny_tile(const uint16_t* a, int64_t lda, Panel panel, int64_t kpairs, float* c,
                      int64_t ldc) {
  __m512 acc[Rows][2];
  for (int r = 0; r < Rows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < kpairs; g0 += Panel::kGroupPairs) {
    panel.begin_group(g0 / Panel::kGroupPairs);
    const int64_t g1 = kpairs - g0 < Panel::kGroupPairs ? kpairs : g0 + Panel::kGroupPairs;
    __m512 part[Chains][Rows][2];
    for (int u = 0; u < Chains; ++u) {
      for (int r = 0; r < Rows; ++r) part[u][r][0] = part[u][r][1] = _mm512_setzero_ps();
    }
    for (int64_t kp0 = g0; kp0 < g1; kp0 += Chains) {  // groups and K are multiples of 16 pairs
      for (int u = 0; u < Chains; ++u) {
        const int64_t kp = kp0 + u;
        _mm_prefetch(panel.data() + kp * Panel::kPairBytes + kPrefetchBytes, _MM_HINT_T0);
        const __m512bh b0 = reinterpret_cast<__m512bh>(panel.row(kp, 0));
        const __m512bh b1 = reinterpret_cast<__m512bh>(panel.row(kp, 1));
        for (int r = 0; r < Rows; ++r) {
          int32_t pair;
          __builtin_memcpy(&pair, a + r * lda + 2 * kp, sizeof(pair));
          const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
          part[u][r][0] = _mm512_dpbf16_ps(part[u][r][0], av, b0);
          part[u][r][1] = _mm512_dpbf16_ps(part[u][r][1], av, b1);
        }
      }
    }
    for (int u = 1; u < Chains; ++u) {
      for (int r = 0; r < Rows; ++r) {
        part[0][r][0] = _mm512_add_ps(part[0][r][0], part[u][r][0]);
        part[0][r][1] = _mm512_add_ps(part[0][r][1], part[u][r][1]);
      }
    }
    if constexpr (Panel::kScaled) {
      for (int r = 0; r < Rows; ++r) {
        acc[r][0] = _mm512_fmadd_ps(part[0][r][0], panel.column_scale(0), acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(part[0][r][1], panel.column_scale(1), acc[r][1]);
      }
    } else {
      for (int r = 0; r < Rows; ++r) {
        acc[r][0] = _mm512_add_ps(acc[r][0], part[0][r][0]);
        acc[r][1] = _mm512_add_ps(acc[r][1], part[0][r][1]);
      }
    }
  }
  for (int r = 0; r < Rows; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

// c[rows][32] (row stride ldc) = a[rows][K] x panel, over tiles of at most kMaxTileRows rows.
template <class Panel>
inline void tiny_tiles(const uint16_t* a, int64_t lda, int64_t rows, const Panel& panel,
                       int64_t kpairs, float* c, int64_t ldc) {
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxTileRows) {
    const uint16_t* ar = a + r0 * lda;
    float* cr = c + r0 * ldc;
    switch (rows - r0 < kMaxTileRows ? rows - r0 : kMaxTileRows) {
      case 1: tiny_tile<1, 4>(ar, lda, panel, kpairs, cr, ldc); break;
      case 2: tiny_tile<2, 2>(ar, lda, panel, kpairs, cr, ldc); break;
      case 3: tiny_tile<3, 2>(ar, lda, panel, kpairs, cr, ldc); break;
      case 4: tiny_tile<4, 1>(ar, lda, panel, kpairs, cr, ldc); break;
      case 5: tiny_tile<5, 1>(ar, lda, panel, kpairs, cr, ldc); break;
      case 6: tiny_tile<6, 1>(ar, lda, panel, kpairs, cr, ldc); break;
      case 7: tiny_tile<7, 1>(ar, lda, panel, kpairs, cr, ldc); break;
      default: tiny_tile<8, 1>(ar, lda, panel, kpairs, cr, ldc); break;
    }
  }
}

// bf16 pairs (lanes = columns) times a per-column fp32 scale, rounded to nearest even, still paired.
inline __m512i scale_pairs(__m512i pairs, __m512 scale) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 even = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)), scale);
  const __m512 odd = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(pairs, high)), scale);
  auto round_high = [&](__m512 v) {  // bf16 of v in the high 16 bits, round to nearest even
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), high);
  };
  return _mm512_or_si512(_mm512_srli_epi32(round_high(even), 16), round_high(odd));
}

// The whole panel to scaled bf16 in the VNNI layout BRGEMM reads ([K/2][32][2], ldb = 32).
template <class Panel>
inline void dequant_panel(Panel panel, int64_t kpairs, uint16_t* out) {
  for (int64_t g0 = 0; g0 < kpairs; g0 += Panel::kGroupPairs) {
    panel.begin_group(g0 / Panel::kGroupPairs);
    const int64_t g1 = kpairs - g0 < Panel::kGroupPairs ? kpairs : g0 + Panel::kGroupPairs;
    for (int64_t kp = g0; kp < g1; ++kp) {
      _mm_prefetch(panel.data() + kp * Panel::kPairBytes + kPrefetchBytes, _MM_HINT_T0);
      for (int half = 0; half < 2; ++half) {
        __m512i v = panel.row(kp, half);
        if constexpr (Panel::kScaled) v = scale_pairs(v, panel.column_scale(half));
        _mm512_storeu_si512(out + kp * 64 + half * 32, v);
      }
    }
  }
}

// fp8 panels take another route to scaled bf16: the byte's 7 magnitude bits under fp16's sign and
// exponent fields make an fp16 of the value times 2^-8, exact for every encoding (fp16 subnormals
// cover e4m3's), which vcvtph2ps widens exactly; one multiply by scale x 2^8 and vcvtne2ps2bf16's
// round to nearest even give what the generic path gives (the same fp32 product, rounded once),
// in half the instructions. Bit 14 (fp16's top exponent bit, a copy of the sign after the shift)
// becomes the NaN flag: adding 1 to the magnitude carries into it exactly for 0x7f, so NaN is fp16
// 0x7f80, which widens to torch's NaN bits and stays them through the multiply and the rounding.
// Each 16-value half converts in place, so the VNNI order is kept.
inline void dequant_panel(const Fp8Panel& panel, int64_t kpairs, uint16_t* out) {
  for (int64_t g0 = 0; g0 < kpairs; g0 += Fp8Panel::kGroupPairs) {
    const __m512 s = _mm512_set1_ps(panel.scale[g0 / Fp8Panel::kGroupPairs] * 256.f);
    const int64_t g1 = kpairs - g0 < Fp8Panel::kGroupPairs ? kpairs : g0 + Fp8Panel::kGroupPairs;
    for (int64_t kp = g0; kp < g1; ++kp) {
      _mm_prefetch(panel.data() + kp * Fp8Panel::kPairBytes + kPrefetchBytes, _MM_HINT_T0);
      for (int half = 0; half < 2; ++half) {
        const __m256i bytes =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel.w + kp * 64 + half * 32));
        // a = x << 7 of the sign-extended byte: sign in bits 15 and 14, the magnitude in 7-13.
        // a ^ ((a + 0x80) & 0x4000): bit 14 is then the carry out of the magnitude, set for NaN only.
        const __m512i a = _mm512_slli_epi16(_mm512_cvtepi8_epi16(bytes), 7);
        const __m512i h = _mm512_ternarylogic_epi32(a, _mm512_add_epi16(a, _mm512_set1_epi16(0x80)),
                                                    _mm512_set1_epi16(0x4000), 0x78);
        const __m512 lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), s);
        const __m512 hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), s);
        _mm512_storeu_si512(out + kp * 64 + half * 32, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
      }
    }
  }
}

// mxfp4 panels to scaled bf16: an e8m0 scale is a power of two, so scaling a nonzero bf16 is an
// add of (e - 127) to its exponent field, exact (the same bits as the fp32 multiply and rounding
// of the generic path) as long as the result stays normal. e2m1 magnitudes 0.5..6 have exponents
// -1..2, so a group whose 32 column scales all lie in [2, 252] takes the add; any other group (a
// scale that underflows or overflows bf16's range) takes the generic multiply. Zeros keep their
// bits under the mask.
inline void dequant_panel(const Mxfp4Panel& panel, int64_t kpairs, uint16_t* out) {
  for (int64_t g0 = 0; g0 < kpairs; g0 += Mxfp4Panel::kGroupPairs) {
    const int64_t g = g0 / Mxfp4Panel::kGroupPairs;
    const int64_t g1 = kpairs - g0 < Mxfp4Panel::kGroupPairs ? kpairs : g0 + Mxfp4Panel::kGroupPairs;
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel.scale + g * 32));
    const bool in_range = (_mm256_cmp_epu8_mask(e, _mm256_set1_epi8(2), _MM_CMPINT_LT) |
                           _mm256_cmp_epu8_mask(e, _mm256_set1_epi8(static_cast<char>(252)), _MM_CMPINT_NLE)) == 0;
    if (!in_range) {
      Mxfp4Panel p = panel;
      p.begin_group(g);
      for (int64_t kp = g0; kp < g1; ++kp) {
        for (int half = 0; half < 2; ++half) {
          _mm512_storeu_si512(out + kp * 64 + half * 32, scale_pairs(p.row(kp, half), p.column_scale(half)));
        }
      }
      continue;
    }
    __m512i add[2];  // per half: (e - 127) << 7 in both 16-bit lanes of each column's pair
    for (int half = 0; half < 2; ++half) {
      const __m128i eh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel.scale + g * 32 + half * 16));
      const __m512i a = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_cvtepu8_epi32(eh), _mm512_set1_epi32(127)), 7);
      add[half] = _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xffff)), _mm512_slli_epi32(a, 16));
    }
    for (int64_t kp = g0; kp < g1; ++kp) {
      _mm_prefetch(panel.data() + kp * Mxfp4Panel::kPairBytes + kPrefetchBytes, _MM_HINT_T0);
      for (int half = 0; half < 2; ++half) {
        const __m512i v = panel.row(kp, half);
        const __mmask32 nonzero = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7fff));
        _mm512_storeu_si512(out + kp * 64 + half * 32, _mm512_mask_add_epi16(v, nonzero, v, add[half]));
      }
    }
  }
}

// tiny_gemm's panel dequantized once for a block of more rows than one tile, kept per thread.
struct TinyScratch {
  AlignedBuffer<uint16_t> decoded;
};

// c[rows][32] (row stride ldc) = a[rows][K] x panel. Up to one tile of rows decodes the weights in
// registers; a larger block dequantizes the panel to bf16 once (as BRGEMM would) and runs every
// tile from that.
template <class Panel>
inline void tiny_gemm(const uint16_t* a, int64_t lda, int64_t rows, const Panel& panel,
                      int64_t kpairs, float* c, int64_t ldc, TinyScratch& scratch) {
  if (rows <= kMaxTileRows || !Panel::kScaled) {  // a bf16 panel is read as it is
    tiny_tiles(a, lda, rows, panel, kpairs, c, ldc);
    return;
  }
  uint16_t* decoded = scratch.decoded.ensure(kpairs * 64);
  dequant_panel(panel, kpairs, decoded);
  tiny_tiles(a, lda, rows, Bf16Panel{decoded}, kpairs, c, ldc);
}

// The fp8 decoders' values at block scale 1, in the packed order: the in-register decoder of
// TinyGEMM, or the panel dequantization of BRGEMM and large blocks. Tests hold them to torch.
inline void decode_fp8(const uint8_t* w, int64_t kpairs, bool dequantize, float* out) {
  const std::vector<float> ones(static_cast<size_t>((kpairs + Fp8Panel::kGroupPairs - 1) / Fp8Panel::kGroupPairs), 1.f);
  Fp8Panel panel{};
  panel.w = w;
  panel.scale = ones.data();
  std::vector<uint16_t> bf16(static_cast<size_t>(kpairs * 64));
  if (dequantize) {
    dequant_panel(panel, kpairs, bf16.data());
  } else {
    for (int64_t kp = 0; kp < kpairs; ++kp) {
      for (int half = 0; half < 2; ++half) _mm512_storeu_si512(bf16.data() + kp * 64 + half * 32, panel.row(kp, half));
    }
  }
  const float unscale = dequantize ? 1.f : 1.f / 256.f;  // the in-register values are times 2^8
  for (size_t i = 0; i < bf16.size(); ++i) {
    const uint32_t bits = static_cast<uint32_t>(bf16[i]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, sizeof(f));
    out[i] = f * unscale;
  }
}

// e^x, 16 lanes: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so r is exact to fp32), e^r
// by its Taylor series to r^7 (truncation below 2e-9 relative, under the fp32 rounding of the
// terms), times 2^n by vscalefps. x is clamped to [-87.5, 88.5] first: e^x stays finite and
// normal, which at the activations' use (1 + e^-h) changes nothing past fp32's precision.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.5f)), _mm512_set1_ps(88.5f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// activation_row_scalar (moe_activation.h), 16 columns at a time; n is a multiple of 16 (a panel
// is 32 columns). min/max take their operands in the order that keeps std::min/std::max's answer
// for a NaN input.
inline void activation_row(Activation act, const float* g, const float* u, const float* bg, const float* bu,
                           int64_t n, float alpha, float limit, uint16_t* dst) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 lim = _mm512_set1_ps(limit);
  const __m512 neg_lim = _mm512_set1_ps(-limit);
  const __m512 neg_alpha = _mm512_set1_ps(-alpha);
  for (int64_t c = 0; c < n; c += 16) {
    __m512 h = _mm512_loadu_ps(g + c);
    if (bg) h = _mm512_add_ps(h, _mm512_loadu_ps(bg + c));
    __m512 v;
    if (act == Activation::kRelu2) {
      h = _mm512_max_ps(h, _mm512_setzero_ps());
      v = _mm512_mul_ps(h, h);
    } else {
      __m512 uv = _mm512_loadu_ps(u + c);
      if (bu) uv = _mm512_add_ps(uv, _mm512_loadu_ps(bu + c));
      if (act == Activation::kSilu) {
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), h));
        v = _mm512_mul_ps(_mm512_div_ps(h, _mm512_add_ps(one, e)), uv);
      } else {
        const __m512 gl = _mm512_min_ps(lim, h);                           // std::min(h, limit)
        const __m512 ul = _mm512_max_ps(_mm512_min_ps(lim, uv), neg_lim);  // std::max(-limit, min)
        const __m512 e = exp_ps(_mm512_mul_ps(neg_alpha, gl));
        v = _mm512_mul_ps(_mm512_div_ps(gl, _mm512_add_ps(one, e)), _mm512_add_ps(ul, one));
      }
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
}

}  // namespace isa
}  // namespace hal_moe
