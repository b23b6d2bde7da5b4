// One specialization of the Marlin MoE kernels: the activation dtype, kIsEP and kHasBias come from
// -D flags (hal.jit passes them), and every launch config of marlin_moe_configs.h is instantiated
// for it. A spec without expert parallelism or bias compiles no EP scan and no bias code.
#include <type_traits>

#include "marlin_moe_configs.h"
#include "marlin_moe_gemm.cuh"
#include "marlin_moe_launch.h"
#include "marlin_moe_pointwise.cuh"
#include "marlin_moe_route.cuh"

#ifndef HAL_MARLIN_FP16
#define HAL_MARLIN_FP16 0
#endif
#ifndef HAL_MARLIN_IS_EP
#define HAL_MARLIN_IS_EP 0
#endif
#ifndef HAL_MARLIN_HAS_BIAS
#define HAL_MARLIN_HAS_BIAS 0
#endif

namespace hal_marlin {
namespace {

using T = std::conditional_t<HAL_MARLIN_FP16 != 0, __half, __nv_bfloat16>;
constexpr bool kIsEP = HAL_MARLIN_IS_EP != 0;
constexpr bool kHasBias = HAL_MARLIN_HAS_BIAS != 0;

// (params, grid_m, splits, programmatic: may start before the previous kernel of the stream ends)
using Launch = cudaError_t (*)(const GemmParams<T>&, int, int, bool, cudaStream_t);

template <int BM, int TK, int TN, int TH, int ST, int MMA>
cudaError_t launch_gemm(const GemmParams<T>& p, int grid_m, int splits, bool programmatic,
                        cudaStream_t stream) {
  constexpr auto kernel = marlin_moe_gemm<T, BM, TK, TN, TH, ST, MMA, kIsEP, kHasBias>;
  constexpr int smem = Tile<BM, TK, TN, TH, ST, MMA>::kSmemBytes;
  // Above 48 KiB a kernel must opt in once per process before its first launch.
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (opt_in != cudaSuccess) return opt_in;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid_m, p.n / TN, splits);
  config.blockDim = dim3(TH);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, p);
}

// Programmatic dependent launch needs sm_90; asked once per device.
bool programmatic_launch_supported() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  static int known[64] = {};  // 0 unknown, 1 no, 2 yes
  if (device < 0 || device >= 64) return false;
  if (known[device] == 0) {
    const bool yes = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
                         cudaSuccess && major >= 9;
    known[device] = yes ? 2 : 1;
  }
  return known[device] == 2;
}

struct Entry {
  int block_m, thread_k, thread_n, threads, stages, mma, smem;
  Launch launch;
  const void* function;
};

#define HAL_MARLIN_CONFIG(BM, TK, TN, TH, ST, MMA)                                  \
  Entry{BM, TK, TN, TH, ST, MMA, Tile<BM, TK, TN, TH, ST, MMA>::kSmemBytes,            \
        &launch_gemm<BM, TK, TN, TH, ST, MMA>,                                         \
        reinterpret_cast<const void*>(&marlin_moe_gemm<T, BM, TK, TN, TH, ST, MMA, kIsEP, kHasBias>)},
const Entry kEntries[] = {HAL_MARLIN_ALL_CONFIGS};
#undef HAL_MARLIN_CONFIG

constexpr int kNumEntries = sizeof(kEntries) / sizeof(kEntries[0]);

// The pointwise kernels (layer without fused epilogues): 256 threads, and at most this many blocks
// of grid-stride loop, enough to fill 132 SMs several times over while keeping the launch small.
constexpr int kPointwiseThreads = 256;
constexpr int kPointwiseMaxBlocks = 4096;

int pointwise_blocks(long long items) {
  const long long blocks = (items + kPointwiseThreads - 1) / kPointwiseThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kPointwiseMaxBlocks ? kPointwiseMaxBlocks : blocks));
}

bool gemm_shape_ok(const Entry& e, int n, int k, int splits) {
  return splits >= 1 && splits <= kMaxSplits && n % e.thread_n == 0 && k % (splits * e.thread_k) == 0;
}

// Params of one GEMM with no fused epilogue (kStore or kAtomic); the layer adds its own.
GemmParams<T> plain_params(const GemmProblem& g) {
  GemmParams<T> p{};
  p.a = static_cast<const T*>(g.a);
  p.a_route_div = g.a_route_div;
  p.w = static_cast<const int4*>(g.w);
  p.scales = static_cast<const T*>(g.scales);
  p.group = g.group;
  p.bias = g.bias;
  p.route_weight = g.route_weight;
  p.sorted_routes = g.sorted_routes;
  p.block_expert = g.block_expert;
  p.num_blocks = g.num_blocks;
  p.c = g.c;
  p.c_split_stride = g.c_atomic ? 0 : g.c_split_stride;
  p.c_row_div = g.c_row_div;
  p.mode = g.c_atomic ? kAtomic : kStore;
  p.routes = g.routes;
  p.n = g.n;
  p.k = g.k;
  p.k_slice = g.k / g.splits;
  return p;
}

cudaError_t check_gemm(const GemmProblem& g) {
  if (g.config < 0 || g.config >= kNumEntries) return cudaErrorInvalidValue;
  const Entry& e = kEntries[g.config];
  if (!gemm_shape_ok(e, g.n, g.k, g.splits) || (g.k % g.group) != 0 || g.grid_m < 1)
    return cudaErrorInvalidValue;
  if (!g.c_atomic && g.splits > 1 && g.c_split_stride == 0) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

int num_configs() { return kNumEntries; }

cudaError_t kernel_info(int config, KernelInfo* info) {
  if (config < 0 || config >= kNumEntries) return cudaErrorInvalidValue;
  const Entry& e = kEntries[config];
  cudaFuncAttributes attr;
  const cudaError_t err = cudaFuncGetAttributes(&attr, e.function);
  if (err != cudaSuccess) return err;
  *info = KernelInfo{e.block_m, e.thread_k, e.thread_n, e.threads, e.stages, e.mma, e.smem,
                     attr.numRegs, static_cast<int>(attr.sharedSizeBytes),
                     static_cast<int>(attr.localSizeBytes), attr.maxThreadsPerBlock};
  return cudaSuccess;
}

cudaError_t run_gemm(const GemmProblem& g, cudaStream_t stream) {
  const cudaError_t bad = check_gemm(g);
  if (bad != cudaSuccess) return bad;
  return kEntries[g.config].launch(plain_params(g), g.grid_m, g.splits, false, stream);
}

cudaError_t run_route(const RouteProblem& r, cudaStream_t stream) {
  const size_t smem = 2 * sizeof(int) * static_cast<size_t>(r.num_experts);
  // Only the kIsEP build skips blocks of other ranks' experts, so only it may be given any.
  if (r.ids_int64) {
    moe_route<int64_t><<<1, kRouteThreads, smem, stream>>>(
        static_cast<const int64_t*>(r.topk_ids), r.routes, r.num_experts, r.local_experts, r.expert_map,
        kIsEP, r.block_m, r.sorted_routes, r.block_expert, r.num_blocks, r.route_expert,
        r.block_arrivals, r.arrival_stride);
  } else {
    moe_route<int32_t><<<1, kRouteThreads, smem, stream>>>(
        static_cast<const int32_t*>(r.topk_ids), r.routes, r.num_experts, r.local_experts, r.expert_map,
        kIsEP, r.block_m, r.sorted_routes, r.block_expert, r.num_blocks, r.route_expert,
        r.block_arrivals, r.arrival_stride);
  }
  return cudaGetLastError();
}

cudaError_t run_moe(const MoeProblem& p, cudaStream_t stream) {
  if (p.config13 < 0 || p.config13 >= kNumEntries || p.config2 < 0 || p.config2 >= kNumEntries)
    return cudaErrorInvalidValue;
  const int block_m = kEntries[p.config13].block_m;
  if (kEntries[p.config2].block_m != block_m) return cudaErrorInvalidValue;
  if (p.hidden % 64 != 0 || p.w13_rows % 64 != 0) return cudaErrorInvalidValue;
  if (p.fusion < kFuseNone || p.fusion > kFuseActivationAndRounding) return cudaErrorInvalidValue;
  const int routes = p.tokens * p.top_k;
  const bool split13 = p.splits13 > 1;
  const bool activate_in_gemm1 = p.fusion != kFuseNone;
  const bool round_in_gemm2 = p.fusion == kFuseActivationAndRounding;

  cudaError_t err = run_route(RouteProblem{p.topk_ids, p.ids_int64, routes, p.num_experts,
                                           p.local_experts, block_m, p.expert_map, p.sorted_routes,
                                           p.block_expert, p.num_blocks, p.route_expert,
                                           activate_in_gemm1 && split13 ? p.block_arrivals : nullptr,
                                           p.w13_rows / 64},
                              stream);
  if (err != cudaSuccess) return err;

  const GemmProblem g1{p.x, p.top_k, p.w13, p.s13, p.group13, p.b13, nullptr, p.sorted_routes,
                       p.block_expert, p.num_blocks, p.c1, static_cast<size_t>(routes) * p.w13_rows,
                       1, false, routes, p.w13_rows, p.hidden, p.grid_m, p.config13, p.splits13};
  if ((err = check_gemm(g1)) != cudaSuccess) return err;
  GemmParams<T> p1 = plain_params(g1);
  if (activate_in_gemm1) {
    p1.mode = split13 ? kStoreThenActivate : kActivate;
    p1.act_out = static_cast<T*>(p.a2);
    p1.activation = p.activation;
    p1.alpha = p.alpha;
    p1.limit = p.limit;
    p1.arrivals = p.block_arrivals;
    p1.arrival_stride = p.w13_rows / 64;
    p1.init = LayerInit<T>{p.acc, static_cast<T*>(p.out), round_in_gemm2 ? p.token_arrivals : nullptr,
                           p.route_expert, p.tokens, p.top_k, p.hidden, p.splits2};
  }
  // GEMM 1 launches while the routing runs and waits for it; GEMM 2 launches when every GEMM 1
  // block is on its last MoE block (activation fused) or the activation kernel ends, prefetches
  // its first weights into L2, then waits for its predecessor.
  const bool programmatic = p.overlap > 0 && programmatic_launch_supported();
  if ((err = kEntries[p.config13].launch(p1, p.grid_m, p.splits13, programmatic, stream)) != cudaSuccess)
    return err;

  const long long acc_count = static_cast<long long>(p.tokens) * p.hidden;
  if (!activate_in_gemm1) {
    const long long act_items = static_cast<long long>(routes) * (p.inter / 4);
    moe_activation<T, kIsEP>
        <<<pointwise_blocks(act_items > acc_count / 4 ? act_items : acc_count / 4), kPointwiseThreads, 0,
           stream>>>(p.c1, p.splits13, static_cast<T*>(p.a2), p.route_expert, routes, p.inter,
                     p.activation, p.alpha, p.limit, p.acc, acc_count);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }

  const GemmProblem g2{p.a2, 1, p.w2, p.s2, p.group2, p.b2, p.topk_weights, p.sorted_routes,
                       p.block_expert, p.num_blocks, p.acc, 0, p.top_k, true, routes, p.hidden,
                       p.inter, p.grid_m, p.config2, p.splits2};
  if ((err = check_gemm(g2)) != cudaSuccess) return err;
  GemmParams<T> p2 = plain_params(g2);
  if (round_in_gemm2) {
    p2.mode = kAtomicThenRound;
    p2.arrivals = p.token_arrivals;
    p2.arrival_stride = p.hidden / 64;
    p2.arrival_target = p.top_k * p.splits2;
    p2.out = static_cast<T*>(p.out);
  }
  p2.prefetch_before_wait = programmatic && p.overlap == 2;
  if ((err = kEntries[p.config2].launch(p2, p.grid_m, p.splits2, programmatic, stream)) != cudaSuccess)
    return err;
  if (!round_in_gemm2) {
    moe_to_dtype<T><<<pointwise_blocks(acc_count / 4), kPointwiseThreads, 0, stream>>>(
        p.acc, static_cast<T*>(p.out), acc_count);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace hal_marlin
