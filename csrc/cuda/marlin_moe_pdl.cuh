// Programmatic dependent launch for the layer's chain of kernels (routing -> GEMM 1 -> GEMM 2).
#pragma once

namespace hal_marlin {

// Programmatic dependent launch (sm_90): a kernel launched with the attribute may start while the
// previous kernel of the stream still runs; it must not read that kernel's output before
// grid_dependency_wait(), which returns once the previous kernel completed and its writes are
// visible. allow_dependents() lets the next kernel launch before this one completes. Both are no-ops
// for a launch without the attribute and on older archs.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace hal_marlin
