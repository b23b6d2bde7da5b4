// Sorted-token routing on the GPU: groups the (token, slot) routes by expert and pads each
// expert's group to a multiple of block_m, so every MoE block of the GEMM reads one expert.
// One thread block does it all (counts in shared memory, one block-wide scan), which keeps the
// hot path free of host synchronization: the GEMM grid is sized for the worst case and blocks past
// *num_blocks return at once.
#pragma once

#include <cub/block/block_scan.cuh>
#include <stdint.h>

#include "marlin_moe_pdl.cuh"

namespace hal_marlin {

constexpr int kRouteThreads = 1024;

// Shared memory: 2 ints per global expert (route count, then first block of the expert).
//
// A route is sorted only when it runs here, or, with keep_remote (the kIsEP build), when its
// expert is mapped to -1 (another rank's). Every other route adds nothing and is left out of every
// block, with route_expert -1: an id of -1 (a dropped route, as engines mark masked routes), any
// id outside [0, num_experts), and an expert_map value outside [-1, local_experts) (or -1 itself
// in a build without EP). check=True rejects the invalid ones before the launch; with check=False
// this one test per route is what keeps shared memory, the map and the weights in bounds.
template <typename IdT>
__global__ void __launch_bounds__(kRouteThreads)
    moe_route(const IdT* __restrict__ topk_ids, int routes, int num_experts, int local_experts,
              const int* __restrict__ expert_map, bool keep_remote, int block_m,
              int* __restrict__ sorted_routes, int* __restrict__ block_expert,
              int* __restrict__ num_blocks, int* __restrict__ route_expert,
              int* __restrict__ block_arrivals, int arrival_stride) {
  extern __shared__ int route_smem[];
  int* counts = route_smem;
  int* first_block = route_smem + num_experts;
  using Scan = cub::BlockScan<int, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int tid = threadIdx.x;
  // GEMM 1 may launch now: its blocks wait for this kernel's output before reading any of it, and
  // this one block leaves the rest of the GPU to them.
  allow_dependents();

  auto local_of = [&](int e) { return expert_map != nullptr ? expert_map[e] : e; };
  // The global expert a route is sorted under, or -1 when it is left out.
  auto sorted_expert = [&](int r) {
    const IdT id = topk_ids[r];
    if (id < 0 || id >= static_cast<IdT>(num_experts)) return -1;
    const int e = static_cast<int>(id);
    const int local = local_of(e);
    const bool here = local >= 0 && local < local_experts;
    return here || (keep_remote && local == -1) ? e : -1;
  };

  for (int e = tid; e < num_experts; e += kRouteThreads) counts[e] = 0;
  __syncthreads();
  for (int r = tid; r < routes; r += kRouteThreads) {
    const int e = sorted_expert(r);
    if (e >= 0) atomicAdd(&counts[e], 1);
  }
  __syncthreads();

  // Each thread owns a contiguous run of experts, so a block-wide scan orders all blocks. Blocks of
  // local experts come first: the GEMMs walk blocks in order, so the work spreads evenly over
  // their grid, and the blocks of other ranks' experts (-1, skipped under kIsEP) trail. An expert
  // with a count has a local id in [0, local_experts), or -1 under keep_remote.
  const int per_thread = (num_experts + kRouteThreads - 1) / kRouteThreads;
  const int e_begin = min(tid * per_thread, num_experts);
  const int e_end = min(e_begin + per_thread, num_experts);
  int my_local = 0;
  int my_remote = 0;
  for (int e = e_begin; e < e_end; ++e) {
    const int blocks = (counts[e] + block_m - 1) / block_m;
    if (local_of(e) >= 0) {
      my_local += blocks;
    } else {
      my_remote += blocks;
    }
  }
  int run_local = 0, total_local = 0, run_remote = 0, total_remote = 0;
  Scan(scan_storage).ExclusiveSum(my_local, run_local, total_local);
  __syncthreads();  // the scan's temporary storage is reused
  Scan(scan_storage).ExclusiveSum(my_remote, run_remote, total_remote);
  run_remote += total_local;
  const int total = total_local + total_remote;
  for (int e = e_begin; e < e_end; ++e) {
    const int blocks = (counts[e] + block_m - 1) / block_m;
    const int local = local_of(e);
    int& run = local >= 0 ? run_local : run_remote;
    first_block[e] = run;
    for (int b = 0; b < blocks; ++b) block_expert[run + b] = local;
    run += blocks;
  }
  if (tid == 0) *num_blocks = total;
  for (int i = tid; i < total * block_m; i += kRouteThreads) sorted_routes[i] = routes;
  // GEMM 1's per-(block, column tile) arrival counters (kStoreThenActivate), when it splits K.
  if (block_arrivals != nullptr) {
    for (int i = tid; i < total * arrival_stride; i += kRouteThreads) block_arrivals[i] = 0;
  }
  __syncthreads();  // padding written and first_block known before the scatter overwrites slots

  for (int e = tid; e < num_experts; e += kRouteThreads) counts[e] = 0;
  __syncthreads();
  for (int r = tid; r < routes; r += kRouteThreads) {
    const int e = sorted_expert(r);
    if (e < 0) {
      route_expert[r] = -1;
      continue;
    }
    const int slot = atomicAdd(&counts[e], 1);
    sorted_routes[first_block[e] * block_m + slot] = r;
    route_expert[r] = local_of(e);
  }
}

}  // namespace hal_marlin
