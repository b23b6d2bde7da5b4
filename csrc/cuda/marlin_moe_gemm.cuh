// Marlin-style W4A16 grouped GEMM over MoE blocks. Free of torch headers: it compiles standalone
// (nvcc -std=c++17 -arch=sm_90 -c) and the launchers in marlin_moe.cu instantiate it.
//
// One thread block computes C[route, n0 : n0 + TN] for the BM routed rows of one MoE block and
// one K slice. The product runs transposed: the weight tile is the mma A operand (16 output
// channels x 16 k) and the activations are the B operand (16 k x 8 tokens), so a block of 8 rows
// fills an m16n8k16 tile with no padding.
//
// Repacked weight layout (backends/marlin/repack.py writes it):
//   int32 [E][N/64][K/16][32 lanes][4 words]; word j of lane l = g*4 + t holds the 8 nibbles of
//   the 16x16 tile (n = n64*64 + j*16 + {g, g+8}, k = k16*16 + {2t, 2t+1, 2t+8, 2t+9}) at nibble
//   positions chosen so that (word >> 4i) & 0x000f000f is register i of the mma A fragment.
// A warp's 16-byte loads therefore cover 512 contiguous bytes, one stage of a 64-column slab is
// thread_k / 16 such pieces back to back, and a thread dequantizes a whole A fragment from one
// 32-bit word with 4 shift/lop3/sub/mul quadruples.
//
// Two matrix instructions (Mma below). mma.sync (sm_80 and later): each warp owns a 64-column
// slab and issues m16n8k16 per 16 columns and 8 tokens. wgmma (sm_90a, block_m 48, 64): a warpgroup
// issues m64nNk16 (N = block_m) with the same A fragments in registers, one 16-column tile per
// warp, and the activations read by the tensor cores straight from shared memory, so the mma no
// longer waits on ldmatrix and a warp's issue slots go to the dequantization.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "marlin_moe_pdl.cuh"
#include "marlin_moe_pointwise.cuh"

namespace hal_marlin {

// What a block does with its fp32 tile.
//   kStore             one stored partial per K split (c), nothing else
//   kAtomic            fp32 atomics into the row route / c_row_div of c (sums splits and routes)
//   kActivate          (one K split) the activation in registers, rounded into act_out
//   kStoreThenActivate kStore, then an arrival on the (MoE block, column tile) counter: the last of
//                      the K splits to arrive sums the stored partials and activates them
//   kAtomicThenRound   kAtomic, then an arrival on each of its tokens' (token, column tile)
//                      counters: the last route / K split of a token to arrive rounds its fp32 sums
//                      into out
// The activation modes read GEMM 1's columns gate/up interleaved by 16 (see gate_up_columns in
// backends/marlin/repack.py): physical column 32q + r holds gate (r < 16) or up (r >= 16) of
// intermediate column 16q + r % 16, so one thread holds both halves of its columns.
enum Epilogue : int { kStore = 0, kAtomic = 1, kActivate = 2, kStoreThenActivate = 3, kAtomicThenRound = 4 };

// GEMM 1 of a layer prepares what GEMM 2 finishes into (it runs first on the stream): zeroes the
// fp32 token sums and, where GEMM 2 rounds them itself (arrivals not null), starts each (token,
// column tile) arrival counter at the arrivals that will never come ((top_k - computed routes of
// the token) * GEMM 2's K splits) and writes the zero output rows of tokens none of whose routes is
// computed here (other ranks' experts, dropped routes).
template <typename T>
struct LayerInit {
  float* acc;               // [tokens][hidden], or null: nothing to prepare
  T* out;                   // [tokens][hidden] (with arrivals)
  int* arrivals;            // [tokens][hidden / 64], or null: a kernel of its own rounds the sums
  const int* route_expert;  // [tokens * top_k] local expert of each route, -1 when not computed
  int tokens, top_k, hidden, splits;
};

template <typename T>
struct GemmParams {
  const T* a;                 // activations, rows of k elements
  int a_route_div;            // A row of a route: route / a_route_div (top_k for GEMM 1, 1 for GEMM 2)
  const int4* w;              // repacked weights (layout above)
  const T* scales;            // [E][k / group][n]
  int group;                  // k elements per scale row (128, or k for per-channel)
  const float* bias;          // [E][n] or null
  const float* route_weight;  // [routes] (topk weight of each route) or null
  const int* sorted_routes;   // [max_blocks * BM], padding holds `routes`
  const int* block_expert;    // [max_blocks] local expert of each block, -1 when not local
  const int* num_blocks;      // [1] blocks the routing produced
  // Output row of a route: c + split * c_split_stride + (route / c_row_div) * n. Either one
  // partial sum per K split, stored (GEMM 1), or a sum over splits and top-k routes by fp32
  // atomics (GEMM 2 into the token's row); see Epilogue.
  float* c;
  size_t c_split_stride;
  int c_row_div;
  int mode;                   // Epilogue
  int routes;                 // tokens * top_k, also the padding sentinel
  int n;
  int k;
  int k_slice;                // k per split (gridDim.z splits)
  // kActivate / kStoreThenActivate: [routes][n / 2] (n for relu2) in the activation dtype
  T* act_out;
  int activation;             // Activation
  float alpha, limit;
  // kStoreThenActivate: [blocks][arrival_stride] counters, zero at launch (the routing zeroes
  // them). kAtomicThenRound: [routes / c_row_div][arrival_stride], started by LayerInit.
  int* arrivals;
  int arrival_stride;
  int arrival_target;         // kAtomicThenRound: top_k * K splits
  T* out;                     // kAtomicThenRound: [routes / c_row_div][n]
  LayerInit<T> init;
  // Launched before the previous kernel of the stream completes (GEMM 2 of a layer): the routing
  // is done, the activations are not, so each block first prefetches its first weights into L2.
  bool prefetch_before_wait;
};

template <typename T>
struct DtypeOps;

template <>
struct DtypeOps<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  // 0x4300 is 128.0 in bf16 with a mantissa step of 1: OR-ing a nibble into the low mantissa bits
  // gives 128 + q exactly; subtracting 136 = 128 + 8 leaves the signed uint4b8 value q - 8.
  static constexpr uint32_t kMagic = 0x43004300u;
  __device__ static T2 offset() { return __floats2bfloat162_rn(136.f, 136.f); }
  __device__ static T2 pair(__nv_bfloat16 v) { return __halves2bfloat162(v, v); }
  __device__ static void mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <>
struct DtypeOps<__half> {
  using T2 = __half2;
  // 0x6400 is 1024.0 in fp16 with a mantissa step of 1: 1024 + q, minus 1032 = q - 8, exactly.
  static constexpr uint32_t kMagic = 0x64006400u;
  __device__ static T2 offset() { return __floats2half2_rn(1032.f, 1032.f); }
  __device__ static T2 pair(__half v) { return __halves2half2(v, v); }
  __device__ static void mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The matrix instruction of a config (the last field of HAL_MARLIN_CONFIG).
enum Mma : int { kMmaSync = 0, kWgmma = 1 };

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HAL_MARLIN_HAS_WGMMA 1
#else
#define HAL_MARLIN_HAS_WGMMA 0
#endif

// wgmma m64nNk16 (N = block_m: 48 or 64 tokens), D += A * B: A (the dequantized weights)
// in registers, B (N tokens x 16 k, K-major) in shared memory through `desc`, fp32 D in d[N / 2]
// in the mma.sync C layout per 8 tokens. The asm spells each N's operand list: N / 2 accumulator
// registers, then the four A registers and the descriptor.
#define HAL_MARLIN_D8(i)                                                                           \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),      \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define HAL_MARLIN_OPERANDS_N48                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "                                  \
  "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, %26, %27}, %28"
#define HAL_MARLIN_OPERANDS_N64                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "                                  \
  "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, "                                   \
  "%26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36"
#define HAL_MARLIN_WGMMA_ASM(SHAPE, TYPE, OPERANDS, ...)                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                          \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " OPERANDS            \
               ", p, 1, 1, 0;\n}\n"                                                                \
               : __VA_ARGS__                                                                       \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))
#define HAL_MARLIN_WGMMA_OF_TYPE(SHAPE, OPERANDS, ...)                                             \
  if constexpr (std::is_same_v<T, __half>) {                                                       \
    HAL_MARLIN_WGMMA_ASM(SHAPE, "f16", OPERANDS, __VA_ARGS__);                                     \
  } else {                                                                                         \
    HAL_MARLIN_WGMMA_ASM(SHAPE, "bf16", OPERANDS, __VA_ARGS__);                                    \
  }

// Any other N issues nothing: an mma.sync config's block compiles the wgmma stage but never runs
// it, and Tile asserts the block_m of a wgmma config.
template <typename T, int N>
__device__ __forceinline__ void wgmma_m64k16(float* d, const uint32_t* a, uint64_t desc) {
#if HAL_MARLIN_HAS_WGMMA
  if constexpr (N == 48) {
    HAL_MARLIN_WGMMA_OF_TYPE("m64n48k16", HAL_MARLIN_OPERANDS_N48, HAL_MARLIN_D8(0), HAL_MARLIN_D8(8),
                             HAL_MARLIN_D8(16))
  } else if constexpr (N == 64) {
    HAL_MARLIN_WGMMA_OF_TYPE("m64n64k16", HAL_MARLIN_OPERANDS_N64, HAL_MARLIN_D8(0), HAL_MARLIN_D8(8),
                             HAL_MARLIN_D8(16), HAL_MARLIN_D8(24))
  }
#endif
}
#undef HAL_MARLIN_WGMMA_OF_TYPE
#undef HAL_MARLIN_WGMMA_ASM
#undef HAL_MARLIN_OPERANDS_N48
#undef HAL_MARLIN_OPERANDS_N64
#undef HAL_MARLIN_D8

// Shared-memory matrix descriptor of a K-major tile stored in 128-byte rows with the 128-byte
// swizzle (16-byte chunk c of row r at c ^ (r % 8)), 8-row groups 1024 bytes apart; the tile's
// 1024-byte atoms must be 1024-aligned. Leading byte offset unused (a k16 step is 32 bytes of
// one row), set to 1 as CUTLASS does.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() {
#if HAL_MARLIN_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if HAL_MARLIN_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if HAL_MARLIN_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// cp.async writes shared memory through the generic proxy, wgmma reads it through the async one.
__device__ __forceinline__ void fence_async_shared() {
#if HAL_MARLIN_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving reads of accumulators that wgmma writes asynchronously above
// the wait that completes them.
__device__ __forceinline__ void fence_operand(float& x) { asm volatile("" : "+f"(x)::"memory"); }

// 16-byte global -> shared copy that skips L1; src_bytes = 0 fills the destination with zeros
// and reads nothing (padding rows of a MoE block).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;  // (a & b) | c in one instruction: immLut = (0xF0 & 0xCC) | 0xAA
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

template <typename T>
__device__ __forceinline__ void dequant_fragment(uint32_t q, typename DtypeOps<T>::T2 scale_lo,
                                                 typename DtypeOps<T>::T2 scale_hi, uint32_t* frag) {
  using Ops = DtypeOps<T>;
  using T2 = typename Ops::T2;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t biased = lop3_and_or(q >> (4 * i), 0x000f000fu, Ops::kMagic);
    T2 v = *reinterpret_cast<const T2*>(&biased);
    v = __hmul2(__hsub2(v, Ops::offset()), (i & 1) ? scale_hi : scale_lo);
    frag[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Compile-time geometry of one config; the host side reads kSmemBytes to launch it.
template <int BM, int TK, int TN, int THREADS, int STAGES, int MMA>
struct Tile {
  static constexpr bool kWg = MMA == kWgmma;
  static constexpr int kWarps = THREADS / 32;
  static constexpr int kWarpsN = TN / 64;
  // wgmma: no K warps; each warpgroup owns kSlabsPerGroup slabs, one 16-column tile of each pair
  // of slabs per warp and wgmma (compute_stage_wgmma)
  static constexpr int kWarpsK = kWg ? 1 : kWarps / kWarpsN;
  static constexpr int kSlabsPerGroup = kWarpsN / (THREADS / 128);
  static constexpr int kAccTiles = kWg ? kSlabsPerGroup : 4;  // 16-column tiles a thread accumulates
  static constexpr int kStepsPerWarp = TK / 16 / kWarpsK;
  static constexpr int kTokenTiles = BM / 8;
  static constexpr int kAChunksPerRow = TK / 8;  // 16-byte chunks of one activation row
  static constexpr int kAUnits = BM * kAChunksPerRow;
  static constexpr int kWUnits = (TK / 16) * kWarpsN * 32;
  static constexpr int kSUnits = TN / 8;
  // wgmma reads the activations in 1024-byte swizzle atoms: every stage starts on one, and the
  // pipeline gets the slack to align its start
  static constexpr int kStageUnits = kWg ? (kAUnits + kWUnits + kSUnits + 63) / 64 * 64
                                         : kAUnits + kWUnits + kSUnits;
  static constexpr int kAccPerThread = kAccTiles * kTokenTiles * 4;
  static constexpr int kPipeBytes = STAGES * kStageUnits * 16 + (kWg ? 1024 : 0);
  static constexpr int kReduceBytes = kWarpsK > 1 ? kWarpsN * kAccPerThread * 32 * 4 : 0;
  static constexpr int kSmemBytes = kPipeBytes > kReduceBytes ? kPipeBytes : kReduceBytes;
  // Decode-sized blocks (8-16 rows) need several resident blocks per SM to keep weight loads in
  // flight, so hold them to 128 registers a thread (2 blocks of 256 threads, 4 of 128). Without the
  // bound ptxas picked 161 registers for m16 k128 n256 t256 in the plain build and 127 in the EP +
  // bias build of the same tile, so the occupancy rule saw two different kernels.
  static constexpr int kMinBlocksPerSm = BM <= 16 ? 65536 / (THREADS * 128) : 1;

  static_assert(BM == 8 || BM % 16 == 0, "block_m is 8 or a multiple of 16");
  static_assert(TK == 64 || TK == 128, "thread_k divides the 128 scale group and is >= 64");
  static_assert(TN % 64 == 0 && kWarps % kWarpsN == 0, "each warp owns 64 columns");
  static_assert((TK / 16) % kWarpsK == 0, "k16 steps split evenly over the K warps");
  static_assert(kWUnits % THREADS == 0 && kSUnits <= THREADS, "loads split evenly");
  static_assert(!kWg || ((BM == 48 || BM == 64) && THREADS % 128 == 0 &&
                         kWarpsN % (THREADS / 128) == 0 && kSlabsPerGroup % 2 == 0 && kSlabsPerGroup <= 4),
                "wgmma: block_m 48 or 64 (its n), whole warpgroups, pairs of slabs per warpgroup");
};

// One MoE block: C[routes of the block, n0 : n0 + TN] over one K slice. smem: the pipeline's
// stages (1024-aligned for wgmma).
template <typename T, int BM, int TK, int TN, int THREADS, int STAGES, int MMA, bool kHasBias>
__device__ __forceinline__ void gemm_block(const GemmParams<T>& p, const int expert, int4* smem,
                                           const int* s_routes) {
  using Ops = DtypeOps<T>;
  using T2 = typename Ops::T2;
  using G = Tile<BM, TK, TN, THREADS, STAGES, MMA>;
  const int tid = threadIdx.x;
  const int n0 = blockIdx.y * TN;
  const int k_begin = blockIdx.z * p.k_slice;
  const int k_tiles = p.k_slice / TK;

  // Each thread copies the same activation chunks in every stage: resolve their rows once.
  constexpr int kAIters = (G::kAUnits + THREADS - 1) / THREADS;
  const T* a_src[kAIters];
  bool a_valid[kAIters];
  int a_dst[kAIters];
#pragma unroll
  for (int i = 0; i < kAIters; ++i) {
    const int c = tid + i * THREADS;
    const int row = c / G::kAChunksPerRow;
    const int col = c % G::kAChunksPerRow;
    const int route = c < G::kAUnits ? s_routes[row] : p.routes;
    a_valid[i] = route < p.routes;
    a_src[i] = p.a + (a_valid[i] ? static_cast<size_t>(route / p.a_route_div) * p.k : 0) + k_begin +
               col * 8;
    // XOR swizzle of the 16-byte chunks so that ldmatrix's 8 rows hit 8 distinct bank groups;
    // for wgmma, the 128-byte swizzle of rows of 64 k: one [BM][64] tile per 64 k of the stage.
    const int dst = G::kWg ? (col / 8) * BM * 8 + row * 8 + ((col % 8) ^ (row & 7))
                           : row * G::kAChunksPerRow + (col ^ (row & 7));
    a_dst[i] = c < G::kAUnits ? dst : -1;
  }

  const size_t k16_total = p.k / 16;
  const size_t n64_total = p.n / 64;
  const int4* w_expert = p.w + static_cast<size_t>(expert) * k16_total * n64_total * 32;
  const T* s_expert = p.scales + static_cast<size_t>(expert) * (p.k / p.group) * p.n + n0;

  auto load_stage = [&](int stage, int kt) {
    int4* s_a = smem + stage * G::kStageUnits;
    int4* s_w = s_a + G::kAUnits;
    int4* s_s = s_w + G::kWUnits;
    const int k0 = k_begin + kt * TK;
#pragma unroll
    for (int i = 0; i < kAIters; ++i) {
      if (a_dst[i] >= 0) cp_async16(s_a + a_dst[i], a_src[i] + kt * TK, a_valid[i]);
    }
#pragma unroll
    for (int i = 0; i < G::kWUnits / THREADS; ++i) {
      const int u = tid + i * THREADS;
      const int k16 = u / (G::kWarpsN * 32);
      const int rem = u % (G::kWarpsN * 32);
      const size_t src = ((n0 / 64 + rem / 32) * k16_total + k0 / 16 + k16) * 32 + rem % 32;
      cp_async16(s_w + u, w_expert + src, true);
    }
    if (tid < G::kSUnits) {
      cp_async16(s_s + tid, s_expert + static_cast<size_t>(k0 / p.group) * p.n + tid * 8, true);
    }
  };

  const int warp = tid / 32;
  const int lane = tid % 32;
  const int wn = warp % G::kWarpsN;
  const int wk = G::kWg ? 0 : warp / G::kWarpsN;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int wg = warp / 4;  // wgmma: the warpgroup, and the warp in it
  const int wq = warp % 4;

  // wgmma: accumulator tile j of a warp is 16-column tile 2 (wq % 2) + j % 2 of slab
  // 2 (j / 2) + wq / 2 of its warpgroup's, so the tiles j = 2i, 2i + 1 are one gate/up pair (see
  // Epilogue). mma.sync: tile j of the warp's slab.
  auto slab_of = [&](int j) { return G::kWg ? wg * G::kSlabsPerGroup + 2 * (j / 2) + wq / 2 : wn; };
  auto column = [&](int j, int hi) {  // of C, from n0, of accumulator tile j's row g + 8 hi
    const int tile = G::kWg ? 2 * (wq % 2) + j % 2 : j;
    return slab_of(j) * 64 + tile * 16 + g + hi * 8;
  };
  // Gated activation: the intermediate column of gate/up pair i (tiles 2i, 2i + 1), row g + 8 hi.
  auto act_column = [&](int i, int hi) {
    const int pair = G::kWg ? wq % 2 : i;  // in its 64-column slab
    return (n0 + slab_of(2 * i) * 64) / 2 + pair * 16 + g + hi * 8;
  };

  float acc[G::kAccTiles][G::kTokenTiles][4];  // set after the pipeline's first copies are issued

  auto compute_stage_mma_sync = [&](int stage) {
    const int4* s_a = smem + stage * G::kStageUnits;
    const int4* s_w = s_a + G::kAUnits;
    const T* s_s = reinterpret_cast<const T*>(s_w + G::kWUnits);
    T2 scale_lo[4], scale_hi[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      scale_lo[j] = Ops::pair(s_s[wn * 64 + j * 16 + g]);
      scale_hi[j] = Ops::pair(s_s[wn * 64 + j * 16 + g + 8]);
    }
#pragma unroll
    for (int step = 0; step < G::kStepsPerWarp; ++step) {
      const int ks = wk + step * G::kWarpsK;
      const int4 q = s_w[(ks * G::kWarpsN + wn) * 32 + lane];
      uint32_t b[G::kTokenTiles][2];
      if constexpr (G::kTokenTiles == 1) {
        const int tok = lane & 7;
        const int kc = ks * 2 + ((lane >> 3) & 1);
        const uint32_t addr = smem_addr(s_a + tok * G::kAChunksPerRow + (kc ^ (tok & 7)));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(b[0][0]), "=r"(b[0][1])
                     : "r"(addr));
      } else {
#pragma unroll
        for (int tp = 0; tp < G::kTokenTiles / 2; ++tp) {
          const int tok = tp * 16 + ((lane >> 4) << 3) + (lane & 7);
          const int kc = ks * 2 + ((lane >> 3) & 1);
          const uint32_t addr = smem_addr(s_a + tok * G::kAChunksPerRow + (kc ^ (tok & 7)));
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                       : "=r"(b[2 * tp][0]), "=r"(b[2 * tp][1]), "=r"(b[2 * tp + 1][0]),
                         "=r"(b[2 * tp + 1][1])
                       : "r"(addr));
        }
      }
      const uint32_t words[4] = {static_cast<uint32_t>(q.x), static_cast<uint32_t>(q.y),
                                 static_cast<uint32_t>(q.z), static_cast<uint32_t>(q.w)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t frag[4];
        dequant_fragment<T>(words[j], scale_lo[j], scale_hi[j], frag);
#pragma unroll
        for (int tt = 0; tt < G::kTokenTiles; ++tt) Ops::mma(acc[j][tt], frag, b[tt]);
      }
    }
  };

  // Per k16 step the warp dequantizes its accumulator tiles' A fragments while the previous step's
  // wgmmas run (fragments double-buffered by step parity), then the warpgroup issues one m64nNk16
  // per tile. The stage's wgmmas are complete before it returns: its shared memory is refilled next.
  auto compute_stage_wgmma = [&](int stage) {
    const int4* s_a = smem + stage * G::kStageUnits;
    const int4* s_w = s_a + G::kAUnits;
    const T* s_s = reinterpret_cast<const T*>(s_w + G::kWUnits);
    T2 scale_lo[G::kAccTiles], scale_hi[G::kAccTiles];
#pragma unroll
    for (int j = 0; j < G::kAccTiles; ++j) {
      scale_lo[j] = Ops::pair(s_s[column(j, 0)]);
      scale_hi[j] = Ops::pair(s_s[column(j, 1)]);
    }
    const uint32_t a_base = smem_addr(s_a);
    uint32_t frag[2][G::kAccTiles][4];
#pragma unroll
    for (int ks = 0; ks < TK / 16; ++ks) {
#pragma unroll
      for (int pair = 0; pair < G::kAccTiles / 2; ++pair) {
        const int4 q = s_w[(ks * G::kWarpsN + slab_of(2 * pair)) * 32 + lane];
        const uint32_t gate_word = static_cast<uint32_t>(wq % 2 ? q.z : q.x);
        const uint32_t up_word = static_cast<uint32_t>(wq % 2 ? q.w : q.y);
        dequant_fragment<T>(gate_word, scale_lo[2 * pair], scale_hi[2 * pair], frag[ks % 2][2 * pair]);
        dequant_fragment<T>(up_word, scale_lo[2 * pair + 1], scale_hi[2 * pair + 1],
                            frag[ks % 2][2 * pair + 1]);
      }
      const uint64_t desc = wgmma_desc_sw128(a_base + (ks / 4) * BM * 128 + (ks % 4) * 32);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < G::kAccTiles; ++j) wgmma_m64k16<T, BM>(&acc[j][0][0], frag[ks % 2][j], desc);
      wgmma_commit();
      wgmma_wait<1>();
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < G::kAccTiles; ++j)
#pragma unroll
      for (int tt = 0; tt < G::kTokenTiles; ++tt)
#pragma unroll
        for (int c = 0; c < 4; ++c) fence_operand(acc[j][tt][c]);
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  // The bias is the accumulator's starting value in the first K split's first K warp, so the
  // epilogue stays a plain scale-and-store. Its loads go out after the pipeline's first copies:
  // issued before them, a warp would wait the bias's memory latency before starting the pipeline.
#pragma unroll
  for (int j = 0; j < G::kAccTiles; ++j) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      float start = 0.f;
      if constexpr (kHasBias) {
        if (p.bias != nullptr && blockIdx.z == 0 && wk == 0) {
          start = p.bias[static_cast<size_t>(expert) * p.n + n0 + column(j, hi)];
        }
      }
#pragma unroll
      for (int tt = 0; tt < G::kTokenTiles; ++tt) {
        acc[j][tt][hi * 2] = start;
        acc[j][tt][hi * 2 + 1] = start;
      }
    }
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    if constexpr (G::kWg) fence_async_shared();
    __syncthreads();  // stage kt landed for everyone; stage kt-1 is no longer read
    const int next = kt + STAGES - 1;
    if (next < k_tiles) load_stage(next % STAGES, next);
    cp_async_commit();
    if constexpr (G::kWg) {
      compute_stage_wgmma(kt % STAGES);
    } else {
      compute_stage_mma_sync(kt % STAGES);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Warps that split K hand their partial sums to the first K warp, one round per K warp, so the
  // reduction buffer needs only one slot per N warp.
  if constexpr (G::kWarpsK > 1) {
    float* red = reinterpret_cast<float*>(smem);
#pragma unroll 1
    for (int r = 1; r < G::kWarpsK; ++r) {
      if (wk == r) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int tt = 0; tt < G::kTokenTiles; ++tt)
#pragma unroll
            for (int c = 0; c < 4; ++c)
              red[(wn * G::kAccPerThread + (j * G::kTokenTiles + tt) * 4 + c) * 32 + lane] =
                  acc[j][tt][c];
      }
      __syncthreads();
      if (wk == 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int tt = 0; tt < G::kTokenTiles; ++tt)
#pragma unroll
            for (int c = 0; c < 4; ++c)
              acc[j][tt][c] +=
                  red[(wn * G::kAccPerThread + (j * G::kTokenTiles + tt) * 4 + c) * 32 + lane];
      }
      __syncthreads();
    }
  }
  if (wk != 0) return;  // the first K warp of each N warp writes

  if (p.mode == kActivate) {
    const bool gated = p.activation != kRelu2;
    const int n_act = gated ? p.n / 2 : p.n;
#pragma unroll
    for (int tt = 0; tt < G::kTokenTiles; ++tt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int route = s_routes[tt * 8 + t4 * 2 + half];
        if (route >= p.routes) continue;
        T* dst = p.act_out + static_cast<size_t>(route) * n_act;
        if (gated) {
#pragma unroll
          for (int i = 0; i < G::kAccTiles / 2; ++i)
#pragma unroll
            for (int hi = 0; hi < 2; ++hi)
              dst[act_column(i, hi)] = to_dtype<T>(activate(p.activation, acc[2 * i][tt][hi * 2 + half],
                                                            acc[2 * i + 1][tt][hi * 2 + half], p.alpha,
                                                            p.limit));
        } else {
#pragma unroll
          for (int j = 0; j < G::kAccTiles; ++j)
#pragma unroll
            for (int hi = 0; hi < 2; ++hi)
              dst[n0 + column(j, hi)] = to_dtype<T>(activate(kRelu2, acc[j][tt][hi * 2 + half], 0.f, 0.f, 0.f));
        }
      }
    }
    return;
  }

  const bool atomic = p.mode == kAtomic || p.mode == kAtomicThenRound;
  float* c_split = p.c + blockIdx.z * p.c_split_stride;
#pragma unroll
  for (int tt = 0; tt < G::kTokenTiles; ++tt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int route = s_routes[tt * 8 + t4 * 2 + half];
      if (route >= p.routes) continue;  // padding row of the block
      const float weight = p.route_weight != nullptr ? p.route_weight[route] : 1.f;
      float* c_row = c_split + static_cast<size_t>(route / p.c_row_div) * p.n;
#pragma unroll
      for (int j = 0; j < G::kAccTiles; ++j) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int n = n0 + column(j, hi);
          const float v = acc[j][tt][hi * 2 + half] * weight;
          if (atomic) {
            atomicAdd(c_row + n, v);
          } else {
            c_row[n] = v;
          }
        }
      }
    }
  }
}

// K splits a launch may use (backends/marlin/configs.py MAX_SPLITS).
constexpr int kMaxSplits = 16;

// LayerInit's work, spread over every thread of the grid.
template <typename T>
__device__ __forceinline__ void layer_init(const LayerInit<T>& in) {
  const long long threads = static_cast<long long>(gridDim.x) * gridDim.y * gridDim.z * blockDim.x;
  const long long first =
      ((static_cast<long long>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) *
          blockDim.x + threadIdx.x;
  const long long quads = static_cast<long long>(in.tokens) * in.hidden / 4;
#pragma unroll 1
  for (long long i = first; i < quads; i += threads)
    reinterpret_cast<float4*>(in.acc)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (in.arrivals == nullptr) return;
  // One warp per (token, 64-column tile): lane 0 starts its counter, and when the token is idle
  // the warp writes its 64 zero outputs, two consecutive ones a lane, so each store instruction
  // covers 128 contiguous bytes (out is the caller's tensor: no alignment beyond its dtype's).
  const int lane = threadIdx.x % 32;
  const long long warps = threads / 32;
  const int tiles = in.hidden / 64;
  const long long items = static_cast<long long>(in.tokens) * tiles;
#pragma unroll 1
  for (long long i = first / 32; i < items; i += warps) {
    const int token = static_cast<int>(i / tiles);
    int computed = 0;
    for (int r = 0; r < in.top_k; ++r) computed += in.route_expert[token * in.top_k + r] >= 0;
    if (lane == 0) in.arrivals[i] = (in.top_k - computed) * in.splits;
    if (computed == 0) {
      T* dst = in.out + i * 64 + 2 * lane;
      dst[0] = to_dtype<T>(0.f);
      dst[1] = to_dtype<T>(0.f);
    }
  }
}

// The arrival after a kStoreThenActivate / kAtomicThenRound tile: every thread's stores or atomics
// of the tile are fenced before the block counts itself in, and the block that completes a count
// finishes that tile from L2 (__ldcg: other blocks wrote it). No block waits for another, so the
// grid needs no co-residency and a CUDA graph replays it as is.
template <typename T, int BM, int TN, int THREADS>
__device__ __forceinline__ void finish_tile(const GemmParams<T>& p, const int block, const int* s_routes,
                                            int* s_last) {
  const int tid = threadIdx.x;
  const int n0 = blockIdx.y * TN;
  __threadfence();
  __syncthreads();
  if (p.mode == kStoreThenActivate) {
    if (tid == 0) {
      const int before = atomicAdd(&p.arrivals[static_cast<size_t>(block) * p.arrival_stride + blockIdx.y], 1);
      s_last[0] = before == static_cast<int>(gridDim.z) - 1;
    }
    __syncthreads();
    if (!s_last[0]) return;
    __threadfence();
    const bool gated = p.activation != kRelu2;
    const int outs = gated ? TN / 2 : TN;  // activation outputs of this column tile
    const int n_act = gated ? p.n / 2 : p.n;
#pragma unroll 1
    for (int i = tid; i < BM * outs; i += THREADS) {
      const int route = s_routes[i / outs];
      if (route >= p.routes) continue;
      const int o = i % outs;
      const float* row = p.c + static_cast<size_t>(route) * p.n;
      const int col = gated ? n0 + (o / 16) * 32 + o % 16 : n0 + o;
      // Every split's loads go out at once (a round trip to L2 each, on this tile's critical path).
      float gate = 0.f, up = 0.f;
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) {
        if (s < static_cast<int>(gridDim.z)) {
          gate += __ldcg(row + s * p.c_split_stride + col);
          if (gated) up += __ldcg(row + s * p.c_split_stride + col + 16);
        }
      }
      p.act_out[static_cast<size_t>(route) * n_act + (gated ? n0 / 2 + o : col)] =
          to_dtype<T>(activate(p.activation, gate, up, p.alpha, p.limit));
    }
  } else {
    if (tid < BM) {
      const int route = s_routes[tid];
      bool last = false;
      if (route < p.routes) {
        const size_t counter = static_cast<size_t>(route / p.c_row_div) * p.arrival_stride + blockIdx.y;
        last = atomicAdd(&p.arrivals[counter], 1) == p.arrival_target - 1;
      }
      s_last[tid] = last;
    }
    __syncthreads();
    __threadfence();
    constexpr int kQuads = TN / 4;
#pragma unroll 1
    for (int i = tid; i < BM * kQuads; i += THREADS) {
      const int row = i / kQuads;
      if (!s_last[row]) continue;
      const size_t at = static_cast<size_t>(s_routes[row] / p.c_row_div) * p.n + n0 + (i % kQuads) * 4;
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p.c + at));
      T* dst = p.out + at;
      dst[0] = to_dtype<T>(v.x);
      dst[1] = to_dtype<T>(v.y);
      dst[2] = to_dtype<T>(v.z);
      dst[3] = to_dtype<T>(v.w);
    }
  }
}

// Bytes of weights a block prefetches into L2 before waiting for its inputs: with the H200's 132
// SMs x 4 blocks that is at most ~17 MB, about what streams during the previous kernel's tail.
constexpr int kPrefetchBytesPerBlock = 32768;

// The first weights of this block's first MoE block and K slice, into L2 (one bulk prefetch per
// 64-column slab, each contiguous along K in the repacked layout).
template <typename T, int TN>
__device__ __forceinline__ void prefetch_weights_l2(const GemmParams<T>& p, const int expert) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kSlabs = TN / 64;
  if (threadIdx.x >= kSlabs) return;
  const int k_prefetch = min(p.k_slice, kPrefetchBytesPerBlock / kSlabs / 32);  // 32 B per k per slab
  const size_t k16_total = p.k / 16;
  const size_t slab = static_cast<size_t>(expert) * (p.n / 64) + blockIdx.y * kSlabs + threadIdx.x;
  const int4* src = p.w + (slab * k16_total + blockIdx.z * (p.k_slice / 16)) * 32;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(k_prefetch * 32) : "memory");
#endif
}

template <typename T, int BM, int TK, int TN, int THREADS, int STAGES, int MMA, bool kIsEP, bool kHasBias>
__global__ void __launch_bounds__(THREADS, (Tile<BM, TK, TN, THREADS, STAGES, MMA>::kMinBlocksPerSm))
marlin_moe_gemm(const GemmParams<T> p) {
  using G = Tile<BM, TK, TN, THREADS, STAGES, MMA>;
  extern __shared__ int4 smem[];
  // wgmma's swizzle atoms start 1024-aligned in the shared address space (kPipeBytes has the slack)
  int4* const pipe = G::kWg ? smem + ((1024 - (smem_addr(smem) & 1023)) & 1023) / 16 : smem;
  __shared__ int s_routes[BM];
  __shared__ int s_last[BM];
  const int tid = threadIdx.x;
  // GEMM 2's predecessor is GEMM 1, which started after the routing completed: the routing's
  // output may be read before the wait. GEMM 1's predecessor is the routing itself.
  if (p.prefetch_before_wait && blockIdx.x < *p.num_blocks) {
    const int expert = p.block_expert[blockIdx.x];
    if (expert >= 0) prefetch_weights_l2<T, TN>(p, expert);
  }
  grid_dependency_wait();
  const int num_blocks = *p.num_blocks;
  if (p.init.acc != nullptr) layer_init(p.init);
  const bool arrive = p.mode == kStoreThenActivate || p.mode == kAtomicThenRound;
  // The grid holds about as many blocks in x as the planner expects MoE blocks (the routing's
  // count is on the device); each thread block walks the MoE blocks gridDim.x apart, so any
  // routing is covered and no launch is sized for the worst case.
  for (int block = blockIdx.x; block < num_blocks; block += gridDim.x) {
    const int expert = p.block_expert[block];
    if constexpr (kIsEP) {
      if (expert < 0) continue;  // every route of this block goes to another rank's expert
    }
    // The last MoE block of this thread block: the next kernel may launch once every thread block
    // got here (its blocks then fill the SMs this grid's tail leaves idle).
    if (block + static_cast<int>(gridDim.x) >= num_blocks) allow_dependents();
    __syncthreads();  // the previous MoE block is done with shared memory and s_routes
    if (tid < BM) s_routes[tid] = p.sorted_routes[block * BM + tid];
    __syncthreads();
    gemm_block<T, BM, TK, TN, THREADS, STAGES, MMA, kHasBias>(p, expert, pipe, s_routes);
    if (arrive) finish_tile<T, BM, TN, THREADS>(p, block, s_routes, s_last);
  }
}

}  // namespace hal_marlin
