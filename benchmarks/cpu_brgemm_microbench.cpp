// Microbenchmarks of cpu_brgemm's inner loops on AVX-512-BF16 (and AMX for BRGEMM): the fp8 and
// mxfp4 decoders in TinyGEMM, the panel dequantization ahead of BRGEMM, BRGEMM on one panel by
// width, weight streaming from DRAM at decode (one row against every panel) by software prefetch
// distance, and the cost of one OpenMP parallel region. The shipped decoders
// (csrc/cpu/moe_isa_avx512bf16.h) are checked bit for bit against the previous ones on every
// encoding before timing, and both are timed.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "moe_isa_avx512bf16.h"

using hal_moe::isa::Fp8Panel;
using hal_moe::isa::Mxfp4Panel;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The decoders cpu_brgemm shipped before the current ones, for comparison: e4m3 -> exact bf16 with
// a rebias add and a subnormal table (9 instructions per 32 weights), and e2m1 through a 16-entry
// table after splitting the nibbles into 16-bit lanes.
struct Fp8Previous {
  static constexpr bool kScaled = true;
  static constexpr int64_t kGroupPairs = 64;
  static constexpr int64_t kPairBytes = 64;
  const uint8_t* w;
  const float* scale;
  __m512 s;
  const char* data() const { return reinterpret_cast<const char*>(w); }
  void begin_group(int64_t g) { s = _mm512_set1_ps(scale[g]); }
  __m512 column_scale(int) const { return s; }
  __m512i row(int64_t kp, int half) const {
    const __m512i subnormals = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0x3c60, 0x3c40, 0x3c20, 0x3c00, 0x3bc0, 0x3b80, 0x3b00, 0);
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kp * 64 + half * 32));
    const __m512i b = _mm512_cvtepu8_epi16(bytes);
    const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi16(0x7f));
    const __m512i normal = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), _mm512_set1_epi16(120 << 7));
    const __mmask32 tiny = _mm512_cmplt_epu16_mask(mag, _mm512_set1_epi16(8));
    const __m512i v = _mm512_mask_mov_epi16(normal, tiny, _mm512_permutexvar_epi16(mag, subnormals));
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(b, 8), _mm512_set1_epi16(static_cast<int16_t>(0x8000)),
                                     0xF8);
  }
};

// The scales are read as the shipped panel reads them; only the e2m1 decode differs.
struct Mxfp4Previous : Mxfp4Panel {
  __m512i row(int64_t kp, int half) const {
    const __m512i e2m1 = _mm512_set_epi16(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        static_cast<int16_t>(0xc0c0), static_cast<int16_t>(0xc080), static_cast<int16_t>(0xc040),
        static_cast<int16_t>(0xc000), static_cast<int16_t>(0xbfc0), static_cast<int16_t>(0xbf80),
        static_cast<int16_t>(0xbf00), static_cast<int16_t>(0x8000),
        0x40c0, 0x4080, 0x4040, 0x4000, 0x3fc0, 0x3f80, 0x3f00, 0);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + kp * 32 + half * 16));
    const __m512i d = _mm512_cvtepu8_epi32(bytes);
    const __m512i nibbles = _mm512_or_si512(_mm512_and_si512(d, _mm512_set1_epi32(0x0f)),
                                            _mm512_slli_epi32(_mm512_and_si512(d, _mm512_set1_epi32(0xf0)), 12));
    return _mm512_permutexvar_epi16(nibbles, e2m1);
  }
};

// tiny_tile of the shipped header, with a software prefetch PF cache lines ahead of the panel.
template <int Rows, int Chains, int PF, class Panel>
inline void tile(const uint16_t* a, int64_t lda, Panel panel, int64_t kpairs, float* c, int64_t ldc) {
  __m512 acc[Rows][2];
  for (int r = 0; r < Rows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t g0 = 0; g0 < kpairs; g0 += Panel::kGroupPairs) {
    panel.begin_group(g0 / Panel::kGroupPairs);
    const int64_t g1 = kpairs - g0 < Panel::kGroupPairs ? kpairs : g0 + Panel::kGroupPairs;
    __m512 part[Chains][Rows][2];
    for (int u = 0; u < Chains; ++u)
      for (int r = 0; r < Rows; ++r) part[u][r][0] = part[u][r][1] = _mm512_setzero_ps();
    for (int64_t kp0 = g0; kp0 < g1; kp0 += Chains) {
      for (int u = 0; u < Chains; ++u) {
        const int64_t kp = kp0 + u;
        if constexpr (PF > 0) {
          _mm_prefetch(reinterpret_cast<const char*>(panel.w) + kp * Panel::kPairBytes + PF * 64,
                       _MM_HINT_T0);
        }
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
    for (int u = 1; u < Chains; ++u)
      for (int r = 0; r < Rows; ++r) {
        part[0][r][0] = _mm512_add_ps(part[0][r][0], part[u][r][0]);
        part[0][r][1] = _mm512_add_ps(part[0][r][1], part[u][r][1]);
      }
    for (int r = 0; r < Rows; ++r) {
      acc[r][0] = _mm512_fmadd_ps(part[0][r][0], panel.column_scale(0), acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(part[0][r][1], panel.column_scale(1), acc[r][1]);
    }
  }
  for (int r = 0; r < Rows; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

template <int PF, class Panel>
void tile_rows(int rows, const uint16_t* a, int64_t lda, Panel panel, int64_t kpairs, float* c) {
  switch (rows) {
    case 1: tile<1, 4, PF>(a, lda, panel, kpairs, c, 32); break;
    case 2: tile<2, 2, PF>(a, lda, panel, kpairs, c, 32); break;
    case 4: tile<4, 1, PF>(a, lda, panel, kpairs, c, 32); break;
    default: tile<8, 1, PF>(a, lda, panel, kpairs, c, 32); break;
  }
}

template <class Panel>
void tile_pf(int pf, int rows, const uint16_t* a, int64_t lda, Panel panel, int64_t kpairs, float* c) {
  switch (pf) {
    case 0: tile_rows<0>(rows, a, lda, panel, kpairs, c); break;
    case 16: tile_rows<16>(rows, a, lda, panel, kpairs, c); break;
    case 32: tile_rows<32>(rows, a, lda, panel, kpairs, c); break;
    case 64: tile_rows<64>(rows, a, lda, panel, kpairs, c); break;
    default: tile_rows<128>(rows, a, lda, panel, kpairs, c); break;
  }
}

template <class P>
P fp8_panel(const uint8_t* w, const float* s) {
  P p{};
  p.w = w;
  p.scale = s;
  return p;
}

template <class P>
P mxfp4_panel(const uint8_t* w, const uint8_t* s) {
  P p{};
  p.w = w;
  p.scale = s;
  return p;
}

// decoder: shipped / previous (fp8), mxfp4_shipped / mxfp4_previous; s points at fp32 (fp8) or e8m0 scales.
void run_tile(const std::string& decoder, int pf, int rows, const uint16_t* a, int64_t lda, const uint8_t* w,
              const void* s, int64_t kpairs, float* c) {
  if (decoder == "shipped") {
    tile_pf(pf, rows, a, lda, fp8_panel<Fp8Panel>(w, static_cast<const float*>(s)), kpairs, c);
  } else if (decoder == "previous") {
    tile_pf(pf, rows, a, lda, fp8_panel<Fp8Previous>(w, static_cast<const float*>(s)), kpairs, c);
  } else if (decoder == "mxfp4_shipped") {
    tile_pf(pf, rows, a, lda, mxfp4_panel<Mxfp4Panel>(w, static_cast<const uint8_t*>(s)), kpairs, c);
  } else {
    tile_pf(pf, rows, a, lda, mxfp4_panel<Mxfp4Previous>(w, static_cast<const uint8_t*>(s)), kpairs, c);
  }
}

std::map<std::string, double> check_fp8() {
  // Four 64-byte pair rows hold all 256 encodings; 64 pairs make one scale group.
  const int64_t kpairs = 64;
  std::vector<uint8_t> w(kpairs * 64);
  for (int64_t i = 0; i < kpairs * 64; ++i) w[i] = static_cast<uint8_t>(i * 7 + i / 256);
  std::map<std::string, double> out;
  int64_t row_mismatch = 0, row_checked = 0;
  const float one = 1.f;
  Fp8Previous cur = fp8_panel<Fp8Previous>(w.data(), &one);
  Fp8Panel fast = fp8_panel<Fp8Panel>(w.data(), &one);
  for (int64_t kp = 0; kp < kpairs; ++kp) {
    for (int half = 0; half < 2; ++half) {
      alignas(64) uint16_t a[32], b[32];
      _mm512_store_si512(a, cur.row(kp, half));
      _mm512_store_si512(b, fast.row(kp, half));
      for (int j = 0; j < 32; ++j) {
        const uint8_t byte = w[kp * 64 + half * 32 + j];
        if ((byte & 0x7f) == 0x7f) continue;  // NaN
        uint32_t ua = static_cast<uint32_t>(a[j]) << 16, ub = static_cast<uint32_t>(b[j]) << 16;
        float fa, fb;
        std::memcpy(&fa, &ua, 4);
        std::memcpy(&fb, &ub, 4);
        ++row_checked;
        row_mismatch += fa * 256.f != fb;
      }
    }
  }
  out["decode_checked"] = row_checked;
  out["decode_mismatches"] = row_mismatch;
  int64_t dq_mismatch = 0, dq_checked = 0;
  const float scales[] = {1.f, 3.0517578e-05f, 1.2345e-4f, 7.77e-3f, 0.3f, 1.7f, 2.5e-6f};
  std::vector<uint16_t> d0(kpairs * 64), d1(kpairs * 64);
  for (float s : scales) {
    hal_moe::isa::dequant_panel<Fp8Previous>(fp8_panel<Fp8Previous>(w.data(), &s), kpairs, d0.data());
    hal_moe::isa::dequant_panel(fp8_panel<Fp8Panel>(w.data(), &s), kpairs, d1.data());
    for (int64_t i = 0; i < kpairs * 64; ++i) {
      if ((w[i] & 0x7f) == 0x7f) continue;
      ++dq_checked;
      dq_mismatch += d0[i] != d1[i];
    }
  }
  int64_t mx_mismatch = 0;
  const uint8_t e8[64] = {127};
  Mxfp4Previous mcur = mxfp4_panel<Mxfp4Previous>(w.data(), e8);
  Mxfp4Panel mfast = mxfp4_panel<Mxfp4Panel>(w.data(), e8);
  for (int64_t kp = 0; kp < 16; ++kp) {  // 16 x 32 bytes: all 256 encodings, twice
    for (int half = 0; half < 2; ++half) {
      alignas(64) uint16_t a[32], b[32];
      _mm512_store_si512(a, mcur.row(kp, half));
      _mm512_store_si512(b, mfast.row(kp, half));
      for (int j = 0; j < 32; ++j) mx_mismatch += a[j] != b[j];
    }
  }
  out["mxfp4_decode_mismatches"] = mx_mismatch;
  // mxfp4 dequantization, every scale 0..255 across the groups' columns and every encoding
  int64_t mxdq_mismatch = 0;
  std::vector<uint8_t> es(64 * 32);  // 64 groups x 32 columns
  for (int64_t i = 0; i < 64 * 32; ++i) es[i] = static_cast<uint8_t>(i < 32 * 32 ? (i * 37) % 256 : 100 + i % 50);
  std::vector<uint16_t> m0(1024 * 64), m1(1024 * 64);
  std::vector<uint8_t> wm(1024 * 32);
  for (int64_t i = 0; i < 1024 * 32; ++i) wm[i] = static_cast<uint8_t>(i * 13 + i / 256);
  hal_moe::isa::dequant_panel<Mxfp4Previous>(mxfp4_panel<Mxfp4Previous>(wm.data(), es.data()), 1024, m0.data());
  hal_moe::isa::dequant_panel(mxfp4_panel<Mxfp4Panel>(wm.data(), es.data()), 1024, m1.data());
  for (int64_t i = 0; i < 1024 * 64; ++i) mxdq_mismatch += m0[i] != m1[i];
  out["mxfp4_dequant_mismatches"] = mxdq_mismatch;
  out["dequant_checked"] = dq_checked;
  out["dequant_mismatches"] = dq_mismatch;
  return out;
}

// Nanoseconds per call of fn over `reps` calls, best of 5 batches (cache-resident steady state).
template <class F>
double best_ns(int reps, F&& fn) {
  double best = 1e30;
  for (int b = 0; b < 5; ++b) {
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) fn(i);
    best = std::min(best, (now_s() - t0) / reps * 1e9);
  }
  return best;
}

std::vector<uint8_t> random_fp8(int64_t n) {
  std::vector<uint8_t> w(n);
  uint32_t x = 12345;
  for (auto& b : w) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
    if ((b & 0x7f) == 0x7f) b -= 1;
  }
  return w;
}

// One thread, one K x 32 panel in L1/L2: ns per panel for TinyGEMM (rows) or dequantization.
double panel_ns(const std::string& what, const std::string& decoder, int64_t k, int rows, int pf) {
  const int64_t kpairs = k / 2;
  std::vector<uint8_t> w = random_fp8(kpairs * 64);
  const bool mx = decoder.rfind("mxfp4", 0) == 0;
  std::vector<float> fs((k + 127) / 128, 1e-3f);
  std::vector<uint8_t> es(k, 120);
  const void* s = mx ? static_cast<const void*>(es.data()) : static_cast<const void*>(fs.data());
  std::vector<uint16_t> a(8 * k, 0x3f80);
  std::vector<float> c(8 * 32);
  std::vector<uint16_t> dq(kpairs * 64);
  if (what == "tiny") {
    return best_ns(400, [&](int) { run_tile(decoder, pf, rows, a.data(), k, w.data(), s, kpairs, c.data()); });
  }
  if (decoder == "previous") {
    return best_ns(400, [&](int) {
      hal_moe::isa::dequant_panel<Fp8Previous>(fp8_panel<Fp8Previous>(w.data(), fs.data()), kpairs, dq.data());
    });
  }
  if (decoder == "mxfp4_shipped") {
    return best_ns(400, [&](int) {
      hal_moe::isa::dequant_panel(mxfp4_panel<Mxfp4Panel>(w.data(), es.data()), kpairs, dq.data());
    });
  }
  if (decoder == "mxfp4_previous") {
    return best_ns(400, [&](int) {
      hal_moe::isa::dequant_panel(mxfp4_panel<Mxfp4Previous>(w.data(), es.data()), kpairs, dq.data());
    });
  }
  return best_ns(400, [&](int) {
    hal_moe::isa::dequant_panel(fp8_panel<Fp8Panel>(w.data(), fs.data()), kpairs, dq.data());
  });
}

// ns per BRGEMM call of rows x 32 x k on a dequantized bf16 panel (AMX where oneDNN uses it).
double brgemm_ns(int64_t k, int64_t rows, int64_t n) {
  std::vector<at::BFloat16> a(rows * k, at::BFloat16(1.f)), b(k * n, at::BFloat16(0.5f));
  std::vector<float> c(rows * n);
  const double ns = best_ns(200, [&](int) {
    at::native::cpublas::brgemm(rows, n, k, k, n, n, false, a.data(), b.data(), c.data());
  });
  at::native::cpublas::brgemm_release();
  return ns;
}

// GB/s of weight bytes streamed from a buffer several times the L3: every thread takes panels from a
// shared counter (as the kernel's item queue does) and runs a `rows`-row TinyGEMM on each.
double stream_gbps(const at::Tensor& buffer, const std::string& decoder, int pf, int rows, int64_t k) {
  const int64_t kpairs = k / 2;
  const bool mx = decoder.rfind("mxfp4", 0) == 0;
  const int64_t panel_bytes = kpairs * (mx ? 32 : 64);
  const int64_t panels = buffer.numel() / panel_bytes;
  const uint8_t* base = buffer.data_ptr<uint8_t>();
  std::vector<float> fs((k + 127) / 128, 1e-3f);
  std::vector<uint8_t> es(k, 120);
  const void* s = mx ? static_cast<const void*>(es.data()) : static_cast<const void*>(fs.data());
  std::vector<uint16_t> a(8 * k, 0x3f80);
  std::atomic<int64_t> next{0};
  const double t0 = now_s();
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    alignas(64) float c[8 * 32];
    for (int64_t p = next++; p < panels; p = next++) {
      run_tile(decoder, pf, rows, a.data(), k, base + p * panel_bytes, s, kpairs, c);
    }
  });
  return panels * panel_bytes / (now_s() - t0) / 1e9;
}

// GB/s of a plain read of the buffer by every thread (contiguous shares).
double read_gbps(const at::Tensor& buffer) {
  const int64_t n = buffer.numel() / 64;
  const __m512i* base = reinterpret_cast<const __m512i*>(buffer.data_ptr<uint8_t>());
  std::atomic<int64_t> sink{0};
  const double t0 = now_s();
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    __m512i acc = _mm512_setzero_si512();
    for (int64_t i = b; i < e; ++i) acc = _mm512_xor_si512(acc, _mm512_load_si512(base + i));
    sink += _mm512_reduce_add_epi64(acc);
  });
  const double dt = now_s() - t0;
  return (sink.load() == 42 ? 0 : n * 64) / dt / 1e9;
}

// Microseconds per empty at::parallel_for region over every thread.
double region_us(int reps) {
  std::atomic<int64_t> sink{0};
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) {
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t b, int64_t) { sink += b; });
  }
  return (now_s() - t0) / reps * 1e6;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("check_fp8", &check_fp8);
  m.def("panel_ns", &panel_ns);
  m.def("brgemm_ns", &brgemm_ns);
  m.def("stream_gbps", &stream_gbps);
  m.def("read_gbps", &read_gbps);
  m.def("region_us", &region_us);
}
