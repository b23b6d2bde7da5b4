// Fused MoE on CPU with the GEMM path chosen per expert block: BRGEMM (oneDNN through
// at::native::cpublas, AMX where present) on panels dequantized to bf16, or TinyGEMM, a
// register-blocked micro-kernel that dequantizes in registers.
//
//   gather   x rows into sorted (expert-major) order; only local routes, so empty experts and
//            non-local routes cost nothing and touch no weights
//   stage 1  h = act(x W13^T + b13) per block, into a compact bf16 cache [routes, I]
//   stage 2  y = w_topk * (h W2^T + b2) per block, into a compact fp32 cache [routes, H]
//   reduce   out[t] = sum of its routes' rows, in fp32, rounded once to bf16
//
// Weights arrive packed by backends/cpu_brgemm/pack.py: per expert, panels of 32 output columns in
// VNNI order ([K/2][32][2]), gate/up de-interleaved so every gated activation reads gate panel p
// and up panel p + I/32.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "moe_routing.h"
#include "moe_scratch.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include "moe_isa_avx512bf16.h"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "moe_isa_avx2.h"
#else
#error "build with -mavx512bf16 (and AVX-512 F/BW/VL/DQ) or -mavx2 -mfma -mf16c"
#endif

#ifndef HAL_OP_NAMESPACE
#error "HAL_OP_NAMESPACE is set by hal/jit.py"
#endif

namespace hal_moe {
namespace {

// Same numbering as backends/cpu_brgemm/policy.py.
enum class Format : int64_t { kBf16 = 0, kFp8Block128 = 1, kMxfp4 = 2 };

constexpr int64_t kPrefetchAheadBytes = MOE_PREFETCH_BYTES;

// One packed weight tensor: [E][panels][panel bytes] with its scales.
struct PackedWeight {
  const uint8_t* w;
  int64_t panels;       // per expert
  int64_t panel_bytes;  // one panel of 32 columns x K
  const uint8_t* scale;
  int64_t scale_panel_bytes;
  int64_t k;

  const uint8_t* panel(int64_t e, int64_t p) const { return w + (e * panels + p) * panel_bytes; }
  const uint8_t* panel_scale(int64_t e, int64_t p) const {
    return scale + (e * panels + p) * scale_panel_bytes;
  }
};

template <class Panel>
Panel make_panel(const PackedWeight& pw, int64_t e, int64_t p);

template <>
isa::Bf16Panel make_panel(const PackedWeight& pw, int64_t e, int64_t p) {
  isa::Bf16Panel panel{};
  panel.w = reinterpret_cast<const uint16_t*>(pw.panel(e, p));
  return panel;
}

template <>
isa::Fp8Panel make_panel(const PackedWeight& pw, int64_t e, int64_t p) {
  isa::Fp8Panel panel{};
  panel.w = pw.panel(e, p);
  panel.scale = reinterpret_cast<const float*>(pw.panel_scale(e, p));
  return panel;
}

template <>
isa::Mxfp4Panel make_panel(const PackedWeight& pw, int64_t e, int64_t p) {
  isa::Mxfp4Panel panel{};
  panel.w = pw.panel(e, p);
  panel.scale = pw.panel_scale(e, p);
  return panel;
}

PackedWeight packed_weight(const at::Tensor& w, const at::Tensor& scale, Format format) {
  // w: uint8 [E, panels, panel_bytes]; scale: [E, panels, *] (empty for bf16).
  const int64_t panel_bytes = w.size(2);
  const int64_t k = format == Format::kMxfp4 ? panel_bytes / 16
                    : format == Format::kFp8Block128 ? panel_bytes / 32
                                                     : panel_bytes / 64;
  const bool has_scale = format != Format::kBf16;
  TORCH_CHECK(!has_scale || (scale.dim() == 3 && scale.is_contiguous()),
              "cpu_brgemm: weight scales must come from prepare_weights");
  return {w.data_ptr<uint8_t>(), w.size(1), panel_bytes,
          has_scale ? static_cast<const uint8_t*>(scale.data_ptr()) : nullptr,
          has_scale ? scale.size(2) * static_cast<int64_t>(scale.element_size()) : 0, k};
}

// One work item: a run of blocks against a group of consecutive output panels. A run with a BRGEMM
// block takes several panels, so each block's activations are read from L3 once per group and then
// stay in L2 while every dequantized panel of the group passes over them; a TinyGEMM-only run takes
// as many as keep one contiguous weight stream per item going without starving threads of items
// (tiny_panel_group).
struct Item {
  int32_t run;
  int32_t first_panel;
  int32_t num_panels;
};

// Panels per BRGEMM item: one block of activations plus the group's dequantized panels (gate and
// up when gated) within the L2 budget.
inline int64_t brgemm_panel_group(int64_t k, bool gated) {
  const int64_t panel_bytes = k * kBlockN * static_cast<int64_t>(sizeof(at::BFloat16));
  const int64_t a_bytes = kBlockM * k * static_cast<int64_t>(sizeof(at::BFloat16));
  const int64_t fit = (kBrgemmL2Bytes - a_bytes) / (panel_bytes * (gated ? 2 : 1));
  return std::max<int64_t>(1, std::min<int64_t>(fit, kMaxPanelGroup));
}

std::vector<Item> make_items(const std::vector<Run>& runs, const std::vector<uint8_t>& brgemm_block,
                             int64_t panels, int64_t brgemm_group, int64_t tiny_group) {
  std::vector<Item> items;
  for (size_t r = 0; r < runs.size(); ++r) {
    bool any_brgemm = false;
    for (int32_t b = runs[r].first_block; b < runs[r].first_block + runs[r].num_blocks; ++b) {
      any_brgemm = any_brgemm || brgemm_block[b];
    }
    const int64_t group = any_brgemm ? brgemm_group : tiny_group;
    for (int64_t p = 0; p < panels; p += group) {
      items.push_back({static_cast<int32_t>(r), static_cast<int32_t>(p),
                       static_cast<int32_t>(std::min(group, panels - p))});
    }
  }
  // Heaviest first: threads take items from a shared queue, so the long runs of hot experts start
  // early and the short ones fill in behind them. A stable counting sort on the work (blocks x
  // panels, a small integer): it runs on the calling thread before the call's parallel region, and
  // a comparison sort there cost tens of microseconds at decode, where every item weighs the same.
  std::vector<int64_t> work(items.size());
  int64_t heaviest = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    work[i] = static_cast<int64_t>(runs[items[i].run].num_blocks) * items[i].num_panels;
    heaviest = std::max(heaviest, work[i]);
  }
  std::vector<int64_t> first(heaviest + 2, 0);  // by heaviest - work: descending work
  for (int64_t w : work) ++first[heaviest - w + 1];
  for (int64_t b = 1; b <= heaviest + 1; ++b) first[b] += first[b - 1];
  std::vector<Item> sorted(items.size());
  for (size_t i = 0; i < items.size(); ++i) sorted[first[heaviest - work[i]]++] = items[i];
  return sorted;
}

// Scratch of one worker of a call's parallel region: output tiles of a panel group, the group's
// panels dequantized to bf16 (gate and up when gated), TinyGEMM's buffers and a reduce row. Its
// size follows the layer's widths and the panel group, never the token count.
struct ThreadScratch {
  AlignedBuffer<float> c0, c1;
  AlignedBuffer<uint16_t> dq0, dq1;
  isa::TinyScratch tiny;
  AlignedBuffer<float> acc;
  bool used_brgemm = false;
};

// What one calling thread's calls keep between calls: the compact caches, which a call's token
// chunks hold under the scratch cap, and one ThreadScratch per worker of its parallel regions (by
// at::get_thread_num()). Kept, because fresh prefill-size mappings are new pages, faulted and
// zeroed on every call; registered process-wide, so release_scratch hands it back from any thread.
// A call holds `in_use` throughout, so a release never frees a running call's buffers.
struct CallScratch {
  std::mutex in_use;
  AlignedBuffer<uint8_t> caches;
  std::vector<std::unique_ptr<ThreadScratch>> workers;

  void ensure_workers(int64_t threads) {
    while (static_cast<int64_t>(workers.size()) < threads) workers.push_back(std::make_unique<ThreadScratch>());
  }
  // A region runs at most `threads` workers; a call made inside another parallel region runs its
  // own inline on one thread, whatever number that thread has.
  ThreadScratch& worker(int64_t tid) {
    return *workers[std::min<size_t>(static_cast<size_t>(tid), workers.size() - 1)];
  }
  void release() {
    caches.release();
    workers.clear();
  }
};

struct ScratchRegistry {
  std::mutex lock;
  std::vector<CallScratch*> all;
};

// Never destroyed: a thread's scratch may unregister after static destruction has begun.
ScratchRegistry& scratch_registry() {
  static ScratchRegistry* registry = new ScratchRegistry;
  return *registry;
}

// The calling thread's scratch, registered for as long as the thread lives.
CallScratch& this_thread_scratch() {
  struct Registered {
    CallScratch scratch;
    Registered() {
      ScratchRegistry& r = scratch_registry();
      std::lock_guard<std::mutex> guard(r.lock);
      r.all.push_back(&scratch);
    }
    ~Registered() {
      ScratchRegistry& r = scratch_registry();
      std::lock_guard<std::mutex> guard(r.lock);
      r.all.erase(std::find(r.all.begin(), r.all.end(), &scratch));
    }
  };
  thread_local Registered registered;
  return registered.scratch;
}

// Frees the scratch of every thread's calls but those running now; returns the bytes still held.
int64_t release_scratch() {
  ScratchRegistry& r = scratch_registry();
  {
    std::lock_guard<std::mutex> guard(r.lock);
    for (CallScratch* scratch : r.all) {
      std::unique_lock<std::mutex> idle(scratch->in_use, std::try_to_lock);
      if (idle.owns_lock()) scratch->release();
    }
  }
  return g_scratch_bytes.load(std::memory_order_relaxed);
}

int64_t scratch_bytes() { return g_scratch_bytes.load(std::memory_order_relaxed); }

// Prefetches the first PREFETCH_BYTES of a panel into L2, so an item's weight stream is already in
// flight when its first K pair row is decoded: the micro-kernels' own prefetch runs that far ahead
// of the row they decode, so without this the first rows of every item wait on DRAM.
inline void prefetch_panel_start(const uint8_t* p, int64_t bytes) {
  const int64_t n = std::min<int64_t>(bytes, kPrefetchAheadBytes);
  for (int64_t off = 0; off < n; off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T1);
  }
}

// One GEMM stage: its work items (run of blocks of one expert x group of output panels) and how one
// item runs. A gated stage 1 computes gate panels p.. and up panels p + second_offset.. in the same
// item, so the activation fuses into the epilogue.
template <class Panel, class Epilogue>
struct Stage {
  const Routing& rt;
  std::vector<Run> runs;
  const std::vector<uint8_t>& brgemm_block;
  const at::BFloat16* a;
  PackedWeight pw;
  int64_t panels;
  int64_t second_offset;
  Epilogue epilogue;
  int64_t brgemm_group = 1;
  std::vector<Item> items;

  Stage(const Routing& rt_, std::vector<Run> runs_, const std::vector<uint8_t>& brgemm_block_,
        const at::BFloat16* a_, const PackedWeight& pw_, int64_t panels_, int64_t second_offset_,
        const Epilogue& epilogue_, int64_t tiny_group)
      : rt(rt_), runs(std::move(runs_)), brgemm_block(brgemm_block_), a(a_), pw(pw_), panels(panels_),
        second_offset(second_offset_), epilogue(epilogue_) {
    brgemm_group = brgemm_panel_group(pw.k, second_offset > 0);
    items = make_items(runs, brgemm_block, panels, brgemm_group, tiny_group);
  }

  int32_t expert_of(const Item& item) const { return rt.blocks[runs[item.run].first_block].expert; }

  // The item's first panel of each stream; later panels of a group follow in memory, where the
  // micro-kernel's own prefetch runs into them.
  void prefetch_start(const Item& item) const {
    const int32_t e = expert_of(item);
    prefetch_panel_start(pw.panel(e, item.first_panel), pw.panel_bytes);
    if (second_offset > 0) prefetch_panel_start(pw.panel(e, item.first_panel + second_offset), pw.panel_bytes);
  }

  void run(const Item& item, ThreadScratch& s) const {
    const int64_t k = pw.k;
    const int64_t kpairs = k / 2;
    const bool two = second_offset > 0;
    const int64_t panel_elems = k * kBlockN;
    const Run& r = runs[item.run];
    const int64_t e = rt.blocks[r.first_block].expert;
    const int64_t ldc = item.num_panels * kBlockN;
    float* c0 = s.c0.ensure(kBlockM * ldc);
    float* c1 = s.c1.ensure(kBlockM * ldc);
    bool dequantized = false;
    for (int64_t b = r.first_block; b < r.first_block + r.num_blocks; ++b) {
      const Block& blk = rt.blocks[b];
      const at::BFloat16* ab = a + static_cast<int64_t>(blk.start) * k;
      if (brgemm_block[b]) {
#if HAL_MOE_ISA_HAS_BRGEMM
        if (!dequantized) {
          s.dq0.ensure(panel_elems * item.num_panels);
          if (two) s.dq1.ensure(panel_elems * item.num_panels);
          for (int64_t q = 0; q < item.num_panels; ++q) {
            const int64_t p = item.first_panel + q;
            isa::dequant_panel(make_panel<Panel>(pw, e, p), kpairs, s.dq0.get() + q * panel_elems);
            if (two) {
              isa::dequant_panel(make_panel<Panel>(pw, e, p + second_offset), kpairs,
                                 s.dq1.get() + q * panel_elems);
            }
          }
          dequantized = true;
        }
        for (int64_t q = 0; q < item.num_panels; ++q) {
          at::native::cpublas::brgemm(
              blk.rows, kBlockN, k, k, kBlockN, ldc, false, ab,
              reinterpret_cast<const at::BFloat16*>(s.dq0.get() + q * panel_elems), c0 + q * kBlockN);
          if (two) {
            at::native::cpublas::brgemm(
                blk.rows, kBlockN, k, k, kBlockN, ldc, false, ab,
                reinterpret_cast<const at::BFloat16*>(s.dq1.get() + q * panel_elems), c1 + q * kBlockN);
          }
        }
        s.used_brgemm = true;
#else
        TORCH_CHECK(false, "cpu_brgemm: BRGEMM is not built for the ", isa::kName, " ISA");
#endif
      } else if (dequantized) {
        // A small block behind BRGEMM blocks of its run: TinyGEMM over the panels already
        // dequantized to bf16, instead of decoding the checkpoint format again.
        const uint16_t* au = reinterpret_cast<const uint16_t*>(ab);
        for (int64_t q = 0; q < item.num_panels; ++q) {
          isa::tiny_gemm(au, k, blk.rows, isa::Bf16Panel{s.dq0.get() + q * panel_elems}, kpairs,
                         c0 + q * kBlockN, ldc, s.tiny);
          if (two) {
            isa::tiny_gemm(au, k, blk.rows, isa::Bf16Panel{s.dq1.get() + q * panel_elems}, kpairs,
                           c1 + q * kBlockN, ldc, s.tiny);
          }
        }
      } else {
        const uint16_t* au = reinterpret_cast<const uint16_t*>(ab);
        for (int64_t q = 0; q < item.num_panels; ++q) {
          const int64_t p = item.first_panel + q;
          isa::tiny_gemm(au, k, blk.rows, make_panel<Panel>(pw, e, p), kpairs, c0 + q * kBlockN, ldc, s.tiny);
          if (two) {
            isa::tiny_gemm(au, k, blk.rows, make_panel<Panel>(pw, e, p + second_offset), kpairs,
                           c1 + q * kBlockN, ldc, s.tiny);
          }
        }
      }
      epilogue(blk, item.first_panel * kBlockN, ldc, c0, c1);
    }
  }
};

struct Epilogue1 {
  at::BFloat16* ic1;  // [routes, I]
  int64_t inter;
  const float* b13;   // [E, w13 rows] or null
  int64_t w13_rows;
  Activation act;
  float alpha, limit;

  // Columns [col, col + ncols) of the block's rows; gate/up tiles have row stride ncols.
  void operator()(const Block& blk, int64_t col, int64_t ncols, const float* gate, const float* up) const {
    const float* bias_g = b13 ? b13 + blk.expert * w13_rows + col : nullptr;
    const float* bias_u = b13 && act != Activation::kRelu2 ? bias_g + inter : nullptr;
    for (int64_t i = 0; i < blk.rows; ++i) {
      isa::activation_row(act, gate + i * ncols, up + i * ncols, bias_g, bias_u, ncols, alpha, limit,
                          reinterpret_cast<uint16_t*>(ic1 + (blk.start + i) * inter + col));
    }
  }
};

struct Epilogue2 {
  const Routing* rt;
  float* ic2;        // [routes, H]
  int64_t hidden;
  const float* b2;   // [E, H] or null

  void operator()(const Block& blk, int64_t col, int64_t ncols, const float* y, const float*) const {
    const float* bias = b2 ? b2 + blk.expert * hidden + col : nullptr;
    for (int64_t i = 0; i < blk.rows; ++i) {
      const int64_t pos = blk.start + i;
      const float w = rt->weight_of_pos[pos];
      float* dst = ic2 + pos * hidden + col;
      const float* src = y + i * ncols;
      for (int64_t c = 0; c < ncols; ++c) dst[c] = w * (src[c] + (bias ? bias[c] : 0.f));
    }
  }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Waits until `counter` reaches `target` (acquire: what the counted tasks wrote is visible after);
// false, at once, when a task of the call has failed, so no thread waits for work that will not come.
inline bool wait_for(const std::atomic<int64_t>& counter, int64_t target, const std::atomic<bool>& failed) {
  for (int64_t spins = 0; counter.load(std::memory_order_acquire) < target; ++spins) {
    if (failed.load(std::memory_order_relaxed)) return false;
    if (spins < kSpinsBeforeYield) {
      _mm_pause();
    } else {
      std::this_thread::yield();  // the task may be running on this core (more threads than cores)
    }
  }
  return true;
}

// Output panels per TinyGEMM-only item: consecutive panels of one expert, about kTinyItemBytes of
// weights, so each item streams one long contiguous range (every item start waits out the DRAM
// latency before its prefetch runs ahead), while keeping kTinyItemsPerThread items per thread.
inline int64_t tiny_panel_group(int64_t blocks, int64_t panels, int64_t item_panel_bytes, int64_t threads) {
  const int64_t by_bytes = kTinyItemBytes / item_panel_bytes;
  const int64_t by_items = blocks * panels / (kTinyItemsPerThread * threads);
  return std::max<int64_t>(1, std::min({by_bytes, by_items, panels}));
}

template <class Panel>
void run_moe(const Routing& rt, const std::vector<uint8_t>& brgemm_block,
             const at::Tensor& x, const PackedWeight& pw13, const PackedWeight& pw2,
             const float* b13, const float* b2, at::Tensor& out, int64_t topk, int64_t inter,
             int64_t local_experts, Activation act, float alpha, float limit, CallScratch& scratch) {
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const int64_t threads = at::get_num_threads();
  const bool gated = act != Activation::kRelu2;
  const int64_t panels1 = inter / kBlockN;
  const int64_t panels2 = hidden / kBlockN;
  const int64_t blocks = static_cast<int64_t>(rt.blocks.size());
  // The compact caches, each on a cache-line boundary: xs bf16 [routes, H], ic1 bf16 [routes, I],
  // ic2 fp32 [routes, H].
  auto lines = [](int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  const int64_t xs_bytes = lines(rt.routes * hidden * 2), ic1_bytes = lines(rt.routes * inter * 2);
  uint8_t* base = scratch.caches.ensure(xs_bytes + ic1_bytes + rt.routes * hidden * 4);
  at::BFloat16* xsp = reinterpret_cast<at::BFloat16*>(base);
  at::BFloat16* ic1p = reinterpret_cast<at::BFloat16*>(base + xs_bytes);
  float* ic2p = reinterpret_cast<float*>(base + xs_bytes + ic1_bytes);
  const at::BFloat16* xp = x.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();

  auto gather = [&](int64_t begin, int64_t end) {
    for (int64_t pos = begin; pos < end; ++pos) {
      std::memcpy(xsp + pos * hidden, xp + static_cast<int64_t>(rt.token_of_pos[pos]) * hidden,
                  hidden * sizeof(at::BFloat16));
    }
  };
  auto reduce = [&](int64_t begin, int64_t end, ThreadScratch& s) {
    float* acc = s.acc.ensure(hidden);
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc, acc + hidden, 0.f);
      for (int64_t j = 0; j < topk; ++j) {
        const int32_t pos = rt.pos_of_route[t * topk + j];
        if (pos < 0) continue;
        const float* row = ic2p + static_cast<int64_t>(pos) * hidden;
        for (int64_t h = 0; h < hidden; ++h) acc[h] += row[h];
      }
      for (int64_t h = 0; h < hidden; ++h) op[t * hidden + h] = at::BFloat16(acc[h]);
    }
  };

  Epilogue1 ep1{ic1p, inter, b13, pw13.panels * kBlockN, act, alpha, limit};
  Epilogue2 ep2{&rt, ic2p, hidden, b2};
  const Stage<Panel, Epilogue1> s1(
      rt, make_runs(rt.blocks, panels1, threads), brgemm_block, xsp, pw13, panels1, gated ? panels1 : 0, ep1,
      tiny_panel_group(blocks, panels1, pw13.panel_bytes * (gated ? 2 : 1), threads));
  const Stage<Panel, Epilogue2> s2(rt, make_runs(rt.blocks, panels2, threads), brgemm_block, ic1p, pw2, panels2,
                                   0, ep2, tiny_panel_group(blocks, panels2, pw2.panel_bytes, threads));

  // One parallel region runs the whole call from one queue of tasks: gather chunks, stage-1 items,
  // stage-2 items, reduce chunks, in that order. A task waits only for tasks before it in the queue
  // (stage 1 for the gather; an expert's stage-2 items for all of its stage-1 items; the reduce for
  // all of stage 2), and a thread finishes each task it takes before it takes the next, so every
  // wait ends, however many threads actually run. So stage 2 of the first experts streams its
  // weights while stage 1 of the last ones finishes, instead of every thread waiting at a join, and
  // a call forks once. Items differ in cost (a hot expert's run against a cold expert's single
  // block), so threads take the next task from a shared counter rather than fixed shares.
  const int64_t gather_chunks = std::min<int64_t>(threads, ceil_div(rt.routes * hidden * 2, kCopyChunkBytes));
  const int64_t gather_rows = ceil_div(rt.routes, gather_chunks);
  const int64_t reduce_chunks =
      std::min<int64_t>({threads, tokens, ceil_div(rt.routes * hidden * 4, kCopyChunkBytes)});
  const int64_t reduce_tokens = ceil_div(tokens, reduce_chunks);
  const int64_t n1 = static_cast<int64_t>(s1.items.size());
  const int64_t n2 = static_cast<int64_t>(s2.items.size());
  const int64_t end0 = gather_chunks, end1 = end0 + n1, end2 = end1 + n2, end3 = end2 + reduce_chunks;
  std::vector<int64_t> items1_of(local_experts, 0);
  for (const Item& item : s1.items) ++items1_of[s1.expert_of(item)];
  std::unique_ptr<std::atomic<int64_t>[]> done1_of(new std::atomic<int64_t>[local_experts]);
  for (int64_t e = 0; e < local_experts; ++e) done1_of[e].store(0, std::memory_order_relaxed);
  std::atomic<int64_t> next{0}, gathered{0}, done2{0};
  std::atomic<bool> failed{false};
  scratch.ensure_workers(threads);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    ThreadScratch& worker = scratch.worker(at::get_thread_num());
    worker.used_brgemm = false;
    try {
      for (int64_t i = next++; i < end3; i = next++) {
        if (i < end0) {
          gather(i * gather_rows, std::min(rt.routes, (i + 1) * gather_rows));
          gathered.fetch_add(1, std::memory_order_release);
        } else if (i < end1) {
          const Item& item = s1.items[i - end0];
          s1.prefetch_start(item);
          if (!wait_for(gathered, gather_chunks, failed)) break;
          s1.run(item, worker);
          done1_of[s1.expert_of(item)].fetch_add(1, std::memory_order_release);
        } else if (i < end2) {
          const Item& item = s2.items[i - end1];
          s2.prefetch_start(item);
          const int32_t e = s2.expert_of(item);
          if (!wait_for(done1_of[e], items1_of[e], failed)) break;
          s2.run(item, worker);
          done2.fetch_add(1, std::memory_order_release);
        } else {
          const int64_t c = i - end2;
          if (!wait_for(done2, n2, failed)) break;
          reduce(c * reduce_tokens, std::min(tokens, (c + 1) * reduce_tokens), worker);
        }
      }
    } catch (...) {
      failed.store(true, std::memory_order_relaxed);  // at::parallel_for rethrows it after the region
      throw;
    }
#if HAL_MOE_ISA_HAS_BRGEMM
    // Once per thread, and only when this thread configured AMX tiles (or oneDNN state) at all.
    if (worker.used_brgemm) at::native::cpublas::brgemm_release();
#endif
  });
}

// Without an expert_map the global ids are the local ones, so there are local_experts of them.
Routing route_tensors(const at::Tensor& topk_ids, const at::Tensor& weights_f32,
                      const c10::optional<at::Tensor>& expert_map, int64_t local_experts) {
  TORCH_CHECK(topk_ids.dim() == 2 &&
                  (topk_ids.scalar_type() == at::kInt || topk_ids.scalar_type() == at::kLong),
              "cpu_brgemm: topk_ids must be a 2-D int32 or int64 tensor");
  TORCH_CHECK(weights_f32.numel() == topk_ids.numel(),
              "cpu_brgemm: topk_weights must have one weight per topk id");
  const at::Tensor map_tensor =
      !expert_map.has_value() ? at::Tensor()
      : expert_map->scalar_type() == at::kInt && expert_map->is_contiguous() ? *expert_map
                                                                             : expert_map->to(at::kInt).contiguous();
  const int32_t* map = map_tensor.defined() ? map_tensor.data_ptr<int32_t>() : nullptr;
  const int64_t num_experts = map ? map_tensor.numel() : local_experts;
  const float* w = weights_f32.data_ptr<float>();
  if (topk_ids.scalar_type() == at::kLong) {
    return route(topk_ids.data_ptr<int64_t>(), w, topk_ids.size(0), topk_ids.size(1), map, num_experts,
                 local_experts);
  }
  return route(topk_ids.data_ptr<int32_t>(), w, topk_ids.size(0), topk_ids.size(1), map, num_experts,
               local_experts);
}

// Both stages see the same m_size and a 32-column n_size (H and I are multiples of 32), so one
// decision per block serves both; the plan reports it per stage.
std::vector<uint8_t> block_paths(const Routing& rt, Policy policy, bool supported, int64_t tokens,
                                 int64_t topk, int64_t local_experts) {
  TORCH_CHECK(HAL_MOE_ISA_HAS_BRGEMM || policy != Policy::kBrgemm,
              "cpu_brgemm: the forced 'brgemm' policy needs the avx512bf16 build");
  const bool global = global_uses_brgemm(supported, tokens, topk, local_experts);
  std::vector<uint8_t> paths(rt.blocks.size());
  for (size_t b = 0; b < rt.blocks.size(); ++b) {
    paths[b] = block_path(policy, supported, global, rt.blocks[b].rows, kBlockN) == Path::kBrgemm;
  }
  return paths;
}

void fused_moe(const at::Tensor& x, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
               const c10::optional<at::Tensor>& expert_map, const at::Tensor& w13,
               const at::Tensor& w13_scale, const at::Tensor& w2, const at::Tensor& w2_scale,
               const c10::optional<at::Tensor>& b13, const c10::optional<at::Tensor>& b2,
               at::Tensor& out, int64_t weight_format, int64_t activation, double swiglu_alpha,
               double swiglu_limit, int64_t policy, bool brgemm_supported, int64_t max_chunk_tokens) {
  TORCH_CHECK(max_chunk_tokens > 0, "cpu_brgemm: max_chunk_tokens must be positive");
  TORCH_CHECK(x.is_contiguous() && x.scalar_type() == at::kBFloat16, "cpu_brgemm: x must be contiguous bf16");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == x.sizes() && out.scalar_type() == at::kBFloat16,
              "cpu_brgemm: out must be contiguous bf16 like x");
  TORCH_CHECK(w13.scalar_type() == at::kByte && w13.dim() == 3 && w2.scalar_type() == at::kByte &&
              w2.dim() == 3, "cpu_brgemm: weights must come from prepare_weights");
  const Format format = static_cast<Format>(weight_format);
  const Activation act = static_cast<Activation>(activation);
  const int64_t tokens = x.size(0);
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == tokens,
              "cpu_brgemm: topk_ids must have one row per token");
  const int64_t topk = topk_ids.size(1);
  const int64_t local_experts = w13.size(0);
  const int64_t hidden = x.size(1);
  TORCH_CHECK(w2.size(1) * kBlockN == hidden, "cpu_brgemm: w2 panels do not match the hidden size");
  const PackedWeight pw13 = packed_weight(w13, w13_scale, format);
  const PackedWeight pw2 = packed_weight(w2, w2_scale, format);
  const int64_t intermediate = pw2.k;
  TORCH_CHECK(pw13.k == hidden, "cpu_brgemm: w13 panels do not match hidden size");
  TORCH_CHECK(pw13.panels * kBlockN == (act == Activation::kRelu2 ? 1 : 2) * intermediate,
              "cpu_brgemm: w13 panels do not match the intermediate size");

  // Converted only where needed: at decode every ATen call here is a dispatcher round trip on
  // caches the previous layer's work has evicted.
  const at::Tensor wts = topk_weights.scalar_type() == at::kFloat && topk_weights.is_contiguous()
                             ? topk_weights
                             : topk_weights.to(at::kFloat).contiguous();
  const at::Tensor ids = topk_ids.is_contiguous() ? topk_ids : topk_ids.contiguous();
  TORCH_CHECK(wts.numel() == ids.numel(), "cpu_brgemm: topk_weights must have one weight per topk id");
  const float* b13p = b13.has_value() ? b13->data_ptr<float>() : nullptr;
  const float* b2p = b2.has_value() ? b2->data_ptr<float>() : nullptr;
  const float alpha = static_cast<float>(swiglu_alpha);
  const float limit = static_cast<float>(swiglu_limit);
  CallScratch& scratch = this_thread_scratch();
  std::lock_guard<std::mutex> in_use(scratch.in_use);
  // One pass over a chunk of tokens: routing, both stages and the reduce, as a call of these
  // tokens alone would run them.
  auto pass = [&](const at::Tensor& xc, const at::Tensor& wc, const at::Tensor& ic, at::Tensor& oc) {
    const Routing rt = route_tensors(ic, wc, expert_map, local_experts);
    if (rt.routes == 0) {
      oc.zero_();
      return;
    }
    const std::vector<uint8_t> paths =
        block_paths(rt, static_cast<Policy>(policy), brgemm_supported, xc.size(0), topk, local_experts);
    switch (format) {
      case Format::kBf16:
        run_moe<isa::Bf16Panel>(rt, paths, xc, pw13, pw2, b13p, b2p, oc, topk, intermediate, local_experts, act,
                                alpha, limit, scratch);
        break;
      case Format::kFp8Block128:
        run_moe<isa::Fp8Panel>(rt, paths, xc, pw13, pw2, b13p, b2p, oc, topk, intermediate, local_experts, act,
                               alpha, limit, scratch);
        break;
      case Format::kMxfp4:
        run_moe<isa::Mxfp4Panel>(rt, paths, xc, pw13, pw2, b13p, b2p, oc, topk, intermediate, local_experts, act,
                                 alpha, limit, scratch);
        break;
      default:
        TORCH_CHECK(false, "cpu_brgemm: unknown weight_format code ", weight_format);
    }
  };
  const int64_t chunk = chunk_tokens(tokens, max_chunk_tokens);
  if (chunk >= tokens) {
    pass(x, wts, ids, out);
    return;
  }
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t n = std::min(chunk, tokens - t0);
    at::Tensor oc = out.narrow(0, t0, n);
    pass(x.narrow(0, t0, n), wts.view({tokens, topk}).narrow(0, t0, n), ids.narrow(0, t0, n), oc);
  }
}

// The per-call decision without running: one row per expert block, chunk by chunk as fused_moe
// runs them, (local expert, first sorted position in its chunk, m_size, n_size, stage-1 path,
// stage-2 path).
at::Tensor route_plan(const at::Tensor& topk_ids, const c10::optional<at::Tensor>& expert_map,
                      int64_t local_experts, int64_t policy, bool brgemm_supported, int64_t max_chunk_tokens) {
  TORCH_CHECK(max_chunk_tokens > 0, "cpu_brgemm: max_chunk_tokens must be positive");
  const at::Tensor ids = topk_ids.contiguous();
  const at::Tensor ones = at::ones(ids.sizes(), ids.options().dtype(at::kFloat));
  const int64_t tokens = ids.size(0);
  const int64_t chunk = chunk_tokens(tokens, max_chunk_tokens);
  std::vector<int32_t> rows;
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t n = std::min(chunk, tokens - t0);
    const Routing rt = route_tensors(ids.narrow(0, t0, n), ones.narrow(0, t0, n), expert_map, local_experts);
    const std::vector<uint8_t> paths =
        block_paths(rt, static_cast<Policy>(policy), brgemm_supported, n, ids.size(1), local_experts);
    for (size_t b = 0; b < rt.blocks.size(); ++b) {
      const Block& blk = rt.blocks[b];
      rows.insert(rows.end(), {blk.expert, blk.start, blk.rows, static_cast<int32_t>(kBlockN), paths[b], paths[b]});
    }
  }
  at::Tensor plan = at::empty({static_cast<int64_t>(rows.size() / 6), 6}, ids.options().dtype(at::kInt));
  std::memcpy(plan.data_ptr<int32_t>(), rows.data(), rows.size() * sizeof(int32_t));
  return plan;
}

// The fp8 decoders' values at block scale 1 (isa::decode_fp8) for a uint8 tensor of whole 64-byte
// K pair rows, in its order: tests hold every encoding to torch's float8_e4m3fn conversion.
at::Tensor decode_fp8(const at::Tensor& packed, bool dequantize) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() % 64 == 0,
              "cpu_brgemm: packed must be contiguous uint8 of whole 64-byte K pair rows");
  at::Tensor out = at::empty({packed.numel()}, packed.options().dtype(at::kFloat));
  isa::decode_fp8(packed.data_ptr<uint8_t>(), packed.numel() / 64, dequantize, out.data_ptr<float>());
  return out;
}

// Whether the installed torch packs bf16 B for BRGEMM, which it does where oneDNN uses AMX.
bool brgemm_packs_bf16() { return at::native::cpublas::could_pack(at::kBFloat16); }

std::string isa_name() { return isa::kName; }

}  // namespace
}  // namespace hal_moe

TORCH_LIBRARY(HAL_OP_NAMESPACE, m) {
  m.def("fused_moe(Tensor x, Tensor topk_weights, Tensor topk_ids, Tensor? expert_map, Tensor w13, "
        "Tensor w13_scale, Tensor w2, Tensor w2_scale, Tensor? b13, Tensor? b2, Tensor(a!) out, "
        "int weight_format, int activation, float swiglu_alpha, float swiglu_limit, int policy, "
        "bool brgemm_supported, int max_chunk_tokens) -> ()",
        &hal_moe::fused_moe);
  m.def("route_plan(Tensor topk_ids, Tensor? expert_map, int local_experts, int policy, "
        "bool brgemm_supported, int max_chunk_tokens) -> Tensor",
        &hal_moe::route_plan);
  m.def("release_scratch() -> int", &hal_moe::release_scratch);
  m.def("scratch_bytes() -> int", &hal_moe::scratch_bytes);
  m.def("decode_fp8(Tensor packed, bool dequantize) -> Tensor", &hal_moe::decode_fp8);
  m.def("brgemm_packs_bf16() -> bool", &hal_moe::brgemm_packs_bf16);
  m.def("isa_name() -> str", &hal_moe::isa_name);
}
