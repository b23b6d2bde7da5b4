// TORCH_LIBRARY binding of the Marlin MoE kernels: checks what the C++ side relies on, allocates the
// workspace from torch's caching allocator (so the ops are CUDA-graph capturable) and launches on
// the current stream. hal.jit passes HAL_OP_NAMESPACE, unique per specialization.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "marlin_moe_launch.h"

namespace {

using at::Tensor;

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

hal_marlin::KernelInfo info_of(int64_t config) {
  TORCH_CHECK(config >= 0 && config < hal_marlin::num_configs(), "config=", config,
              ": expected an index in [0, ", hal_marlin::num_configs(), ")");
  hal_marlin::KernelInfo info;
  check_cuda(hal_marlin::kernel_info(static_cast<int>(config), &info), "cudaFuncGetAttributes");
  return info;
}

void check_on(const Tensor& t, const Tensor& x, const char* name) {
  TORCH_CHECK(t.device() == x.device(), name, " is on ", t.device(), ": expected ", x.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

const float* optional_f32(const std::optional<Tensor>& t, const Tensor& x, const char* name) {
  if (!t.has_value()) return nullptr;
  check_on(*t, x, name);
  TORCH_CHECK(t->scalar_type() == at::kFloat, name, " must be float32");
  return t->data_ptr<float>();
}

int64_t max_blocks_for(int64_t routes, int64_t num_experts, int64_t block_m) {
  // sum_e ceil(c_e / block_m) <= routes / block_m + (experts that received a route)
  return (routes + block_m - 1) / block_m + std::min(num_experts, routes);
}

// [num_configs, 11] int64: block_m, thread_k, thread_n, threads, stages, mma (0 mma.sync, 1
// wgmma), dynamic smem bytes, registers per thread, static smem bytes, local (spill) bytes, max
// threads per block.
Tensor kernel_attributes() {
  constexpr int kColumns = 11;
  const int n = hal_marlin::num_configs();
  Tensor table = at::empty({n, kColumns}, at::kLong);
  auto rows = table.accessor<int64_t, 2>();
  for (int i = 0; i < n; ++i) {
    const hal_marlin::KernelInfo k = info_of(i);
    const int64_t values[kColumns] = {k.block_m, k.thread_k, k.thread_n, k.threads, k.stages, k.mma,
                                      k.dynamic_smem, k.num_regs, k.static_smem, k.local_bytes,
                                      k.max_threads};
    for (int j = 0; j < kColumns; ++j) rows[i][j] = values[j];
  }
  return table;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> route(const Tensor& topk_ids,
                                                 const std::optional<Tensor>& expert_map,
                                                 int64_t num_experts, int64_t block_m) {
  TORCH_CHECK(topk_ids.is_cuda() && topk_ids.is_contiguous(), "topk_ids must be a contiguous CUDA tensor");
  TORCH_CHECK(topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong,
              "topk_ids must be int32 or int64");
  const c10::cuda::CUDAGuard guard(topk_ids.device());
  const int64_t routes = topk_ids.numel();
  const int64_t max_blocks = max_blocks_for(routes, num_experts, block_m);
  const auto opts = topk_ids.options().dtype(at::kInt);
  Tensor sorted = at::empty({max_blocks * block_m}, opts);
  Tensor block_expert = at::empty({max_blocks}, opts);
  Tensor num_blocks = at::empty({1}, opts);
  Tensor route_expert = at::empty({routes}, opts);
  const int* map = nullptr;
  if (expert_map.has_value()) {
    check_on(*expert_map, topk_ids, "expert_map");
    map = expert_map->data_ptr<int>();
  }
  check_cuda(hal_marlin::run_route(
                 // This op touches no weights: local ids are bounded by the global count only.
                 hal_marlin::RouteProblem{topk_ids.data_ptr(), topk_ids.scalar_type() == at::kLong,
                                          static_cast<int>(routes), static_cast<int>(num_experts),
                                          static_cast<int>(num_experts), static_cast<int>(block_m),
                                          map, sorted.data_ptr<int>(),
                                          block_expert.data_ptr<int>(), num_blocks.data_ptr<int>(),
                                          route_expert.data_ptr<int>(), nullptr, 0},
                 c10::cuda::getCurrentCUDAStream()),
             "moe_route launch");
  return {sorted, block_expert, num_blocks, route_expert};
}

// One block GEMM on its own (tests localize a failure with it). c_atomic: c is float32
// [routes / c_row_div, n], zeroed by the caller, and receives atomic sums; otherwise c is
// [splits, routes, n] and each K split stores its partial.
void gemm(const Tensor& a, int64_t a_route_div, const Tensor& w, const Tensor& scales, int64_t group,
          const std::optional<Tensor>& bias, const std::optional<Tensor>& route_weight,
          const Tensor& sorted_routes, const Tensor& block_expert, const Tensor& num_blocks,
          const Tensor& c, int64_t c_row_div, bool c_atomic, int64_t routes, int64_t grid_m,
          int64_t config, int64_t splits) {
  const c10::cuda::CUDAGuard guard(a.device());
  for (const Tensor* t : {&w, &scales, &sorted_routes, &block_expert, &num_blocks, &c})
    check_on(*t, a, "gemm operand");
  const int64_t n = c.size(-1);
  TORCH_CHECK(c.scalar_type() == at::kFloat, "c must be float32");
  TORCH_CHECK(c_row_div >= 1 && routes % c_row_div == 0, "c_row_div must divide routes");
  TORCH_CHECK(c.numel() == (c_atomic ? routes / c_row_div * n : splits * routes * n),
              "c has ", c.numel(), " elements: expected ",
              c_atomic ? routes / c_row_div * n : splits * routes * n);
  const int64_t k = a.size(1);
  check_cuda(hal_marlin::run_gemm(
                 hal_marlin::GemmProblem{a.data_ptr(), static_cast<int>(a_route_div), w.data_ptr(),
                                         scales.data_ptr(), static_cast<int>(group),
                                         optional_f32(bias, a, "bias"),
                                         optional_f32(route_weight, a, "route_weight"),
                                         sorted_routes.data_ptr<int>(), block_expert.data_ptr<int>(),
                                         num_blocks.data_ptr<int>(), c.data_ptr<float>(),
                                         static_cast<size_t>(routes * n), static_cast<int>(c_row_div),
                                         c_atomic, static_cast<int>(routes), static_cast<int>(n),
                                         static_cast<int>(k), static_cast<int>(grid_m),
                                         static_cast<int>(config), static_cast<int>(splits)},
                 c10::cuda::getCurrentCUDAStream()),
             "marlin_moe_gemm launch");
}

void moe(const Tensor& x, const Tensor& topk_weights, const Tensor& topk_ids, const Tensor& w13,
         const Tensor& s13, const Tensor& w2, const Tensor& s2, const std::optional<Tensor>& b13,
         const std::optional<Tensor>& b2, const std::optional<Tensor>& expert_map, const Tensor& out,
         int64_t num_experts, int64_t inter, int64_t group13, int64_t group2, int64_t config13, int64_t splits13,
         int64_t config2, int64_t splits2, int64_t grid_m, int64_t activation, double alpha,
         double limit, int64_t overlap, int64_t fusion) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_on(x, x, "x");
  for (const Tensor* t : {&topk_weights, &topk_ids, &w13, &s13, &w2, &s2, &out}) check_on(*t, x, "moe operand");
  TORCH_CHECK(topk_weights.scalar_type() == at::kFloat, "topk_weights must be float32");
  const hal_marlin::KernelInfo info13 = info_of(config13);
  const hal_marlin::KernelInfo info2 = info_of(config2);
  TORCH_CHECK(info13.block_m == info2.block_m, "config13 and config2 must share block_m");
  TORCH_CHECK(x.size(1) % 64 == 0 && s13.size(2) % 64 == 0,
              "hidden size and GEMM 1's columns must be multiples of 64 (the arrival counters' tile)");
  const int64_t tokens = x.size(0), top_k = topk_ids.size(1), hidden = x.size(1);
  const int64_t w13_rows = s13.size(2);
  const int64_t routes = tokens * top_k;
  const int64_t block_m = info13.block_m;
  const int64_t max_blocks = max_blocks_for(routes, num_experts, block_m);
  const auto opts_i = x.options().dtype(at::kInt);
  const auto opts_f = x.options().dtype(at::kFloat);
  Tensor sorted = at::empty({max_blocks * block_m}, opts_i);
  Tensor block_expert = at::empty({max_blocks}, opts_i);
  Tensor num_blocks = at::empty({1}, opts_i);
  Tensor route_expert = at::empty({routes}, opts_i);
  TORCH_CHECK(fusion >= hal_marlin::kFuseNone && fusion <= hal_marlin::kFuseActivationAndRounding,
              "fusion=", fusion, ": expected 0 (none), 1 (activation) or 2 (activation and rounding)");
  // With one K split and the activation fused, GEMM 1 activates in registers: no partials and no
  // arrival counters.
  const bool split13 = splits13 > 1;
  const bool activate_in_gemm1 = fusion != hal_marlin::kFuseNone;
  const bool round_in_gemm2 = fusion == hal_marlin::kFuseActivationAndRounding;
  const bool partials = split13 || !activate_in_gemm1;
  Tensor c1 = at::empty({partials ? splits13 * routes * w13_rows : 0}, opts_f);
  Tensor block_arrivals =
      at::empty({activate_in_gemm1 && split13 ? max_blocks * (w13_rows / 64) : 0}, opts_i);
  Tensor a2 = at::empty({routes, inter}, x.options());
  Tensor acc = at::empty({tokens, hidden}, opts_f);
  Tensor token_arrivals = at::empty({round_in_gemm2 ? tokens * (hidden / 64) : 0}, opts_i);
  const int* map = nullptr;
  if (expert_map.has_value()) {
    check_on(*expert_map, x, "expert_map");
    map = expert_map->data_ptr<int>();
  }
  hal_marlin::MoeProblem p{};
  p.x = x.data_ptr();
  p.topk_weights = topk_weights.data_ptr<float>();
  p.topk_ids = topk_ids.data_ptr();
  p.ids_int64 = topk_ids.scalar_type() == at::kLong;
  p.w13 = w13.data_ptr();
  p.s13 = s13.data_ptr();
  p.group13 = static_cast<int>(group13);
  p.w2 = w2.data_ptr();
  p.s2 = s2.data_ptr();
  p.group2 = static_cast<int>(group2);
  p.b13 = optional_f32(b13, x, "b13");
  p.b2 = optional_f32(b2, x, "b2");
  p.expert_map = map;
  p.out = out.data_ptr();
  p.tokens = static_cast<int>(tokens);
  p.top_k = static_cast<int>(top_k);
  p.num_experts = static_cast<int>(num_experts);
  p.local_experts = static_cast<int>(w13.size(0));
  p.hidden = static_cast<int>(hidden);
  p.inter = static_cast<int>(inter);
  p.w13_rows = static_cast<int>(w13_rows);
  p.config13 = static_cast<int>(config13);
  p.splits13 = static_cast<int>(splits13);
  p.config2 = static_cast<int>(config2);
  p.splits2 = static_cast<int>(splits2);
  p.activation = static_cast<int>(activation);
  p.alpha = static_cast<float>(alpha);
  p.limit = static_cast<float>(limit);
  TORCH_CHECK(overlap >= 0 && overlap <= 2, "overlap=", overlap, ": expected 0, 1 or 2");
  p.overlap = static_cast<int>(overlap);
  p.fusion = static_cast<int>(fusion);
  p.grid_m = static_cast<int>(std::max<int64_t>(1, std::min(grid_m, max_blocks)));
  p.sorted_routes = sorted.data_ptr<int>();
  p.block_expert = block_expert.data_ptr<int>();
  p.num_blocks = num_blocks.data_ptr<int>();
  p.route_expert = route_expert.data_ptr<int>();
  p.c1 = partials ? c1.data_ptr<float>() : nullptr;
  p.block_arrivals = activate_in_gemm1 && split13 ? block_arrivals.data_ptr<int>() : nullptr;
  p.a2 = a2.data_ptr();
  p.acc = acc.data_ptr<float>();
  p.token_arrivals = round_in_gemm2 ? token_arrivals.data_ptr<int>() : nullptr;
  check_cuda(hal_marlin::run_moe(p, c10::cuda::getCurrentCUDAStream()), "marlin moe launch");
}

}  // namespace

// Full schemas: the written outputs (gemm's c, moe's out) are declared mutable, so torch.compile,
// functionalization and torch.library.opcheck see what each op writes.
TORCH_LIBRARY(HAL_OP_NAMESPACE, m) {
  m.def("kernel_attributes() -> Tensor", &kernel_attributes);
  m.def("route(Tensor topk_ids, Tensor? expert_map, int num_experts, int block_m) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
        &route);
  m.def("gemm(Tensor a, int a_route_div, Tensor w, Tensor scales, int group, Tensor? bias, "
        "Tensor? route_weight, Tensor sorted_routes, Tensor block_expert, Tensor num_blocks, "
        "Tensor(a!) c, int c_row_div, bool c_atomic, int routes, int grid_m, int config, "
        "int splits) -> ()",
        &gemm);
  m.def("moe(Tensor x, Tensor topk_weights, Tensor topk_ids, Tensor w13, Tensor s13, Tensor w2, "
        "Tensor s2, Tensor? b13, Tensor? b2, Tensor? expert_map, Tensor(a!) out, int num_experts, "
        "int inter, int group13, int group2, int config13, int splits13, int config2, int splits2, "
        "int grid_m, int activation, float alpha, float limit, int overlap, int fusion) -> ()",
        &moe);
}
