// Routing for the CPU fused MoE: (token, slot) routes sorted by local expert into blocks of
// MOE_BLOCK_M rows, and the GEMM path each block takes. The Python plan and the kernel both read
// these decisions from here, so what `plan()` reports is what runs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace hal_moe {

#ifndef MOE_BLOCK_M
#error "MOE_BLOCK_M is set by backends/cpu_brgemm/policy.py"
#endif
#ifndef MOE_BLOCK_N
#error "MOE_BLOCK_N is set by backends/cpu_brgemm/policy.py"
#endif
#ifndef MOE_BRGEMM_MIN_ROWS
#error "MOE_BRGEMM_MIN_ROWS is set by backends/cpu_brgemm/policy.py"
#endif
#ifndef MOE_ITEMS_PER_THREAD
#error "MOE_ITEMS_PER_THREAD is set by backends/cpu_brgemm/policy.py"
#endif
#ifndef MOE_BRGEMM_L2_BYTES
#error "MOE_BRGEMM_L2_BYTES is set by backends/cpu_brgemm/policy.py"
#endif
#ifndef MOE_MAX_PANEL_GROUP
#error "MOE_MAX_PANEL_GROUP is set by backends/cpu_brgemm/policy.py"
#endif
#if !defined(MOE_TINY_ITEM_BYTES) || !defined(MOE_TINY_ITEMS_PER_THREAD) || !defined(MOE_COPY_CHUNK_BYTES) || \
    !defined(MOE_SPINS_BEFORE_YIELD)
#error "MOE_TINY_ITEM_BYTES, MOE_TINY_ITEMS_PER_THREAD, MOE_COPY_CHUNK_BYTES and MOE_SPINS_BEFORE_YIELD are set by backends/cpu_brgemm/policy.py"
#endif

constexpr int64_t kBlockM = MOE_BLOCK_M;
constexpr int64_t kBlockN = MOE_BLOCK_N;
constexpr int64_t kBrgemmMinRows = MOE_BRGEMM_MIN_ROWS;
constexpr int64_t kItemsPerThread = MOE_ITEMS_PER_THREAD;
constexpr int64_t kBrgemmL2Bytes = MOE_BRGEMM_L2_BYTES;
constexpr int64_t kMaxPanelGroup = MOE_MAX_PANEL_GROUP;
constexpr int64_t kTinyItemBytes = MOE_TINY_ITEM_BYTES;
constexpr int64_t kTinyItemsPerThread = MOE_TINY_ITEMS_PER_THREAD;
constexpr int64_t kCopyChunkBytes = MOE_COPY_CHUNK_BYTES;
constexpr int64_t kSpinsBeforeYield = MOE_SPINS_BEFORE_YIELD;
static_assert(kBlockN == 32, "the micro-kernels hold one 32-column panel in two 16-lane registers");

// Same numbering as backends/cpu_brgemm/policy.py POLICIES.
enum class Policy : int64_t { kPerBlock = 0, kGlobal = 1, kTiny = 2, kBrgemm = 3 };
enum class Path : int32_t { kTiny = 0, kBrgemm = 1 };

struct Block {
  int32_t expert;  // local expert id
  int32_t start;   // first sorted position (row of the compact caches)
  int32_t rows;    // m_size, 1..kBlockM
};

// Blocks of one expert that one work item runs against one weight panel, so a panel dequantized
// for BRGEMM is reused across them.
struct Run {
  int32_t first_block;
  int32_t num_blocks;
};

struct Routing {
  std::vector<int32_t> token_of_pos;  // sorted position -> token
  std::vector<float> weight_of_pos;   // sorted position -> topk weight (fp32)
  std::vector<int32_t> pos_of_route;  // token * topk + slot -> sorted position, -1 when not local
  std::vector<Block> blocks;          // sorted by expert; no block for an expert without routes
  int64_t routes = 0;                 // local routes = rows of the compact caches
};

// The baseline predicate, decided per block by the caller: BRGEMM pays a setup that only blocks of
// more than kBrgemmMinRows rows (or a ragged last panel, which the micro-kernel does not cover)
// win back.
inline bool can_use_brgemm(bool brgemm_supported, int64_t m_size, int64_t n_size) {
  return brgemm_supported && (m_size > kBrgemmMinRows || n_size < kBlockN);
}

// The layer-wide crossover, kept as the benchmark baseline: one answer for every block,
// from the average routes per local expert.
// Tokens per pass of a call: at most max_chunk_tokens, the call split into passes of equal size
// (but the last), so no pass is a small remainder that re-reads the weights for a few tokens.
inline int64_t chunk_tokens(int64_t tokens, int64_t max_chunk_tokens) {
  if (tokens <= max_chunk_tokens) return tokens;
  const int64_t chunks = (tokens + max_chunk_tokens - 1) / max_chunk_tokens;
  return (tokens + chunks - 1) / chunks;
}

inline bool global_uses_brgemm(bool brgemm_supported, int64_t tokens, int64_t topk,
                               int64_t local_experts) {
  const int64_t avg_m = std::max<int64_t>(1, tokens * topk / local_experts);
  return brgemm_supported && avg_m > kBrgemmMinRows;
}

inline Path block_path(Policy policy, bool brgemm_supported, bool global_brgemm, int64_t m_size,
                       int64_t n_size) {
  switch (policy) {
    case Policy::kTiny: return Path::kTiny;
    case Policy::kBrgemm: return Path::kBrgemm;
    case Policy::kGlobal: return global_brgemm ? Path::kBrgemm : Path::kTiny;
    case Policy::kPerBlock: break;
  }
  return can_use_brgemm(brgemm_supported, m_size, n_size) ? Path::kBrgemm : Path::kTiny;
}

// Counting sort of routes by local expert, stable in route order so results are deterministic.
// expert_map (nullable) maps num_experts global ids to local ids or -1; without it global ids are
// local ids.
//
// A route adds nothing (local -1) when its id is -1 (a dropped route) or any other value outside
// [0, num_experts), when its expert is on another rank, or when the map sends it outside
// [0, local_experts). Validation rejects the invalid cases only with check=True, so this pass is
// what keeps every later index (the map, the counts, the weights) in bounds: each map value is
// checked once into `local_of`, and a route costs one unsigned compare beyond what it always cost
// (the map lookup, or nothing without a map).
template <typename IdT>
Routing route(const IdT* topk_ids, const float* topk_weights, int64_t tokens, int64_t topk,
              const int32_t* expert_map, int64_t num_experts, int64_t local_experts) {
  Routing r;
  const int64_t n = tokens * topk;
  const int64_t ids = expert_map ? num_experts : std::min(num_experts, local_experts);
  const uint64_t bound = static_cast<uint64_t>(ids);
  std::vector<int32_t> local_of(expert_map ? num_experts : 0);
  for (size_t g = 0; g < local_of.size(); ++g) {
    const int32_t e = expert_map[g];
    local_of[g] = e >= 0 && e < local_experts ? e : -1;
  }
  std::vector<int32_t> local(n);
  std::vector<int64_t> count(local_experts + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t g = static_cast<uint64_t>(static_cast<int64_t>(topk_ids[i]));  // -1 wraps high
    const int32_t e = g >= bound ? -1 : expert_map ? local_of[g] : static_cast<int32_t>(g);
    local[i] = e;
    if (e >= 0) ++count[e + 1];
  }
  for (int64_t e = 0; e < local_experts; ++e) count[e + 1] += count[e];
  r.routes = count[local_experts];
  r.token_of_pos.resize(r.routes);
  r.weight_of_pos.resize(r.routes);
  r.pos_of_route.assign(n, -1);
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < n; ++i) {
    if (local[i] < 0) continue;
    const int64_t pos = next[local[i]]++;
    r.token_of_pos[pos] = static_cast<int32_t>(i / topk);
    r.weight_of_pos[pos] = topk_weights[i];
    r.pos_of_route[i] = static_cast<int32_t>(pos);
  }
  for (int64_t e = 0; e < local_experts; ++e) {
    for (int64_t s = count[e]; s < count[e + 1]; s += kBlockM) {
      r.blocks.push_back({static_cast<int32_t>(e), static_cast<int32_t>(s),
                          static_cast<int32_t>(std::min(kBlockM, count[e + 1] - s))});
    }
  }
  return r;
}

// Splits each expert's blocks into runs of at most `len` blocks. Longer runs reuse a dequantized
// panel more; the cap keeps any one item (run x panel) within 1 / kItemsPerThread of a thread's
// share of the stage, so one hot expert still spreads over every thread.
inline std::vector<Run> make_runs(const std::vector<Block>& blocks, int64_t panels,
                                  int64_t threads) {
  const int64_t total = static_cast<int64_t>(blocks.size()) * panels;
  const int64_t len = std::max<int64_t>(1, total / (kItemsPerThread * threads));
  std::vector<Run> runs;
  for (size_t b = 0; b < blocks.size();) {
    size_t end = b;
    while (end < blocks.size() && blocks[end].expert == blocks[b].expert) ++end;
    for (size_t s = b; s < end; s += len) {
      runs.push_back({static_cast<int32_t>(s), static_cast<int32_t>(std::min<int64_t>(len, end - s))});
    }
    b = end;
  }
  return runs;
}

}  // namespace hal_moe
