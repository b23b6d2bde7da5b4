// Scratch memory of the CPU fused MoE: aligned buffers that grow and are kept between calls, and a
// count of the bytes they hold across the process. Keeping them spares every call the page faults
// and zeroing of fresh prefill-size mappings; moe_brgemm.cpp bounds what a call needs and hands
// all of it back on request (release_scratch).
#pragma once

#include <c10/util/Exception.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace hal_moe {

constexpr int64_t kAlign = 64;  // bytes: one cache line, and a whole zmm

// Bytes held by every AlignedBuffer of this build, in every thread.
inline std::atomic<int64_t> g_scratch_bytes{0};

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { release(); }

  // At least `count` elements; the contents are not kept when it grows.
  T* ensure(int64_t count) {
    if (static_cast<size_t>(count) > capacity_) {
      const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
      release();
      data_ = static_cast<T*>(std::aligned_alloc(kAlign, bytes));
      TORCH_CHECK(data_, "cpu_brgemm: could not allocate ", bytes, " bytes of scratch");
      capacity_ = bytes / sizeof(T);
      g_scratch_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
    }
    return data_;
  }
  T* get() const { return data_; }
  void release() {
    if (data_ == nullptr) return;
    std::free(data_);
    g_scratch_bytes.fetch_sub(static_cast<int64_t>(capacity_ * sizeof(T)), std::memory_order_relaxed);
    data_ = nullptr;
    capacity_ = 0;
  }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;  // elements
};

}  // namespace hal_moe
