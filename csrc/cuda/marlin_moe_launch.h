// Host interface of the Marlin MoE kernels, free of torch headers: marlin_moe.cu implements it for
// the one specialization it is compiled as (activation dtype, kIsEP, kHasBias from -D flags), and
// marlin_moe_binding.cpp exposes it as TORCH_LIBRARY ops.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace hal_marlin {

// One compiled GEMM config and what the compiler made of it (cudaFuncGetAttributes).
struct KernelInfo {
  int block_m, thread_k, thread_n, threads, stages;
  int mma;           // Mma: 0 mma.sync, 1 wgmma
  int dynamic_smem;  // bytes the launch asks for
  int num_regs, static_smem, local_bytes, max_threads;
};

int num_configs();
cudaError_t kernel_info(int config, KernelInfo* info);

// Device pointers of one MoE block GEMM (see GemmParams in marlin_moe_gemm.cuh).
struct GemmProblem {
  const void* a;
  int a_route_div;
  const void* w;
  const void* scales;
  int group;
  const float* bias;
  const float* route_weight;
  const int* sorted_routes;
  const int* block_expert;
  const int* num_blocks;
  float* c;
  size_t c_split_stride;  // floats between the partials of two K splits (0: atomics)
  int c_row_div;
  bool c_atomic;
  int routes, n, k;
  int grid_m;  // thread blocks along the MoE blocks (each walks blocks grid_m apart)
  int config, splits;
};

cudaError_t run_gemm(const GemmProblem& g, cudaStream_t stream);

struct RouteProblem {
  const void* topk_ids;
  bool ids_int64;
  int routes, num_experts;
  int local_experts;      // experts of the weights: a route's local id must lie below it
  int block_m;
  const int* expert_map;  // null without expert parallelism
  int* sorted_routes;     // [max_blocks * block_m]
  int* block_expert;      // [max_blocks]
  int* num_blocks;        // [1]
  int* route_expert;      // [routes]
  int* block_arrivals;    // [max_blocks][arrival_stride], zeroed for the blocks made; or null
  int arrival_stride;
};

cudaError_t run_route(const RouteProblem& r, cudaStream_t stream);

// Which pointwise stages of the layer run in the GEMMs' epilogues instead of as kernels of their own.
enum Fusion : int {
  // Five launches: route; GEMM 1 stores an fp32 partial for every K split, one split included; the
  // activation kernel sums them, activates, and zeroes GEMM 2's accumulator; GEMM 2 weighted by
  // topk_weights, atomically summed per token; the rounding kernel.
  kFuseNone = 0,
  // Four: GEMM 1 activates in its epilogue (K-split partials summed by the last split of each tile)
  // and zeroes GEMM 2's accumulator; GEMM 2; the rounding kernel.
  kFuseActivation = 1,
  // Three: as kFuseActivation, and the last route or K split of each token tile to arrive in GEMM 2
  // rounds it to the dtype.
  kFuseActivationAndRounding = 2,
};

struct MoeProblem {
  const void* x;
  const float* topk_weights;
  const void* topk_ids;
  bool ids_int64;
  const void* w13;
  const void* s13;
  int group13;
  const void* w2;
  const void* s2;
  int group2;
  const float* b13;
  const float* b2;
  const int* expert_map;
  void* out;
  int tokens, top_k, num_experts, local_experts, hidden, inter, w13_rows;
  int config13, splits13, config2, splits2;
  int activation;  // Activation in marlin_moe_pointwise.cuh
  float alpha, limit;
  int grid_m;  // see GemmProblem
  // How the three launches overlap (sm_90; 0 elsewhere): 0 one after another; 1 GEMM 1 and GEMM 2
  // launched as programmatic dependents, each starting before its predecessor ends and waiting on
  // the device (marlin_moe_pdl.cuh); 2 as 1, and GEMM 2's blocks prefetch their first weights into
  // L2 before they wait.
  int overlap;
  int fusion;  // Fusion
  // workspace, sized for the worst-case block count
  int* sorted_routes;
  int* block_expert;
  int* num_blocks;
  int* route_expert;
  float* c1;   // [splits13][routes][w13_rows], one partial per K split (splits13 > 1 or kFuseNone)
  int* block_arrivals;  // [max_blocks][w13_rows / 64] (splits13 > 1, not kFuseNone)
  void* a2;    // [routes][inter], activation dtype
  float* acc;  // [tokens][hidden], GEMM 2's fp32 sums over splits and top-k routes
  int* token_arrivals;  // [tokens][hidden / 64] (kFuseActivationAndRounding)
};

cudaError_t run_moe(const MoeProblem& p, cudaStream_t stream);

}  // namespace hal_marlin
