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

// Pointwise kernels: 256 threads, and at most this many blocks of grid-stride loop, enough to fill
// 132 SMs several times over while keeping the launch small.
constexpr int kPointwiseThreads = 256;
constexpr int kPointwiseMaxBlocks = 4096;

using Launch = cudaError_t (*)(const GemmParams<T>&, int, int, cudaStream_t);  // (params, grid_m, splits)

template <int BM, int TK, int TN, int TH, int ST>
cudaError_t launch_gemm(const GemmParams<T>& p, int grid_m, int splits, cudaStream_t stream) {
  constexpr auto kernel = marlin_moe_gemm<T, BM, TK, TN, TH, ST, kIsEP, kHasBias>;
  constexpr int smem = Tile<BM, TK, TN, TH, ST>::kSmemBytes;
  // Above 48 KiB a kernel must opt in once per process before its first launch.
  static const cudaError_t opt_in =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (opt_in != cudaSuccess) return opt_in;
  const dim3 grid(grid_m, p.n / TN, splits);
  kernel<<<grid, TH, smem, stream>>>(p);
  return cudaGetLastError();
}

struct Entry {
  int block_m, thread_k, thread_n, threads, stages, smem;
  Launch launch;
  const void* function;
};

#define HAL_MARLIN_CONFIG(BM, TK, TN, TH, ST)                                  \
  Entry{BM, TK, TN, TH, ST, Tile<BM, TK, TN, TH, ST>::kSmemBytes,               \
        &launch_gemm<BM, TK, TN, TH, ST>,                                       \
        reinterpret_cast<const void*>(&marlin_moe_gemm<T, BM, TK, TN, TH, ST, kIsEP, kHasBias>)},
const Entry kEntries[] = {HAL_MARLIN_ALL_CONFIGS};
#undef HAL_MARLIN_CONFIG

constexpr int kNumEntries = sizeof(kEntries) / sizeof(kEntries[0]);

int pointwise_blocks(long long items) {
  const long long blocks = (items + kPointwiseThreads - 1) / kPointwiseThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kPointwiseMaxBlocks ? kPointwiseMaxBlocks : blocks));
}

bool gemm_shape_ok(const Entry& e, int n, int k, int splits) {
  return splits >= 1 && n % e.thread_n == 0 && k % (splits * e.thread_k) == 0;
}

}  // namespace

int num_configs() { return kNumEntries; }

cudaError_t kernel_info(int config, KernelInfo* info) {
  if (config < 0 || config >= kNumEntries) return cudaErrorInvalidValue;
  const Entry& e = kEntries[config];
  cudaFuncAttributes attr;
  const cudaError_t err = cudaFuncGetAttributes(&attr, e.function);
  if (err != cudaSuccess) return err;
  *info = KernelInfo{e.block_m, e.thread_k, e.thread_n, e.threads, e.stages, e.smem,
                     attr.numRegs, static_cast<int>(attr.sharedSizeBytes),
                     static_cast<int>(attr.localSizeBytes), attr.maxThreadsPerBlock};
  return cudaSuccess;
}

cudaError_t run_gemm(const GemmProblem& g, cudaStream_t stream) {
  if (g.config < 0 || g.config >= kNumEntries) return cudaErrorInvalidValue;
  const Entry& e = kEntries[g.config];
  if (!gemm_shape_ok(e, g.n, g.k, g.splits) || (g.k % g.group) != 0 || g.grid_m < 1)
    return cudaErrorInvalidValue;
  if (!g.c_atomic && g.splits > 1 && g.c_split_stride == 0) return cudaErrorInvalidValue;
  const GemmParams<T> p{static_cast<const T*>(g.a), g.a_route_div, static_cast<const int4*>(g.w),
                        static_cast<const T*>(g.scales), g.group, g.bias, g.route_weight,
                        g.sorted_routes, g.block_expert, g.num_blocks, g.c,
                        g.c_atomic ? 0 : g.c_split_stride, g.c_row_div, g.c_atomic, g.routes, g.n,
                        g.k, g.k / g.splits};
  return e.launch(p, g.grid_m, g.splits, stream);
}

cudaError_t run_route(const RouteProblem& r, cudaStream_t stream) {
  const size_t smem = 2 * sizeof(int) * static_cast<size_t>(r.num_experts);
  // Only the kIsEP build skips blocks of other ranks' experts, so only it may be given any.
  if (r.ids_int64) {
    moe_route<int64_t><<<1, kRouteThreads, smem, stream>>>(
        static_cast<const int64_t*>(r.topk_ids), r.routes, r.num_experts, r.local_experts, r.expert_map,
        kIsEP, r.block_m, r.sorted_routes, r.block_expert, r.num_blocks, r.route_expert);
  } else {
    moe_route<int32_t><<<1, kRouteThreads, smem, stream>>>(
        static_cast<const int32_t*>(r.topk_ids), r.routes, r.num_experts, r.local_experts, r.expert_map,
        kIsEP, r.block_m, r.sorted_routes, r.block_expert, r.num_blocks, r.route_expert);
  }
  return cudaGetLastError();
}

cudaError_t run_moe(const MoeProblem& p, cudaStream_t stream) {
  if (p.config13 < 0 || p.config13 >= kNumEntries || p.config2 < 0 || p.config2 >= kNumEntries)
    return cudaErrorInvalidValue;
  const int block_m = kEntries[p.config13].block_m;
  if (kEntries[p.config2].block_m != block_m) return cudaErrorInvalidValue;
  const int routes = p.tokens * p.top_k;

  cudaError_t err = run_route(RouteProblem{p.topk_ids, p.ids_int64, routes, p.num_experts,
                                           p.local_experts, block_m, p.expert_map, p.sorted_routes,
                                           p.block_expert, p.num_blocks, p.route_expert},
                              stream);
  if (err != cudaSuccess) return err;

  err = run_gemm(GemmProblem{p.x, p.top_k, p.w13, p.s13, p.group13, p.b13, nullptr, p.sorted_routes,
                             p.block_expert, p.num_blocks, p.c1,
                             static_cast<size_t>(routes) * p.w13_rows, 1, false, routes, p.w13_rows,
                             p.hidden, p.grid_m, p.config13, p.splits13},
                 stream);
  if (err != cudaSuccess) return err;

  const long long acc_count = static_cast<long long>(p.tokens) * p.hidden;
  const long long act_items = static_cast<long long>(routes) * (p.inter / 4);
  moe_activation<T, kIsEP>
      <<<pointwise_blocks(act_items > acc_count / 4 ? act_items : acc_count / 4), kPointwiseThreads, 0,
         stream>>>(p.c1, p.splits13, static_cast<T*>(p.a2), p.route_expert, routes, p.inter,
                   p.activation, p.alpha, p.limit, p.acc, acc_count);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  err = run_gemm(GemmProblem{p.a2, 1, p.w2, p.s2, p.group2, p.b2, p.topk_weights, p.sorted_routes,
                             p.block_expert, p.num_blocks, p.acc, 0, p.top_k, true, routes, p.hidden,
                             p.inter, p.grid_m, p.config2, p.splits2},
                 stream);
  if (err != cudaSuccess) return err;

  moe_to_dtype<T><<<pointwise_blocks(acc_count / 4), kPointwiseThreads, 0, stream>>>(
      p.acc, static_cast<T*>(p.out), acc_count);
  return cudaGetLastError();
}

}  // namespace hal_marlin
