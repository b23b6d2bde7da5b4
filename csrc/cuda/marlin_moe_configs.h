// Launch-config candidates of the Marlin-style W4A16 MoE GEMM. One line per compiled kernel:
//   HAL_MARLIN_CONFIG(block_m, thread_k, thread_n, threads, stages, mma)
// block_m   rows (routed tokens) per MoE block, one of 8/16/32/48/64: the routing pads each
//           expert's rows up to a multiple of it, so small values waste less at decode.
// thread_k  K elements per pipeline stage (64 or 128: a divisor of the 128-wide scale group, so a
//           stage never straddles two groups; >= 64 so the activation tile's XOR swizzle has its
//           8 sixteen-byte chunks per row).
// thread_n  output columns per block, a multiple of 64: each warp owns 64 columns (4 mma tiles of
//           16), so thread_n / 64 warps split N and the rest split K inside the block.
// threads   128 or 256.
// stages    depth of the cp.async pipeline (3 or 4): enough loads in flight to cover HBM latency.
// mma       0: mma.sync m16n8k16; 1: wgmma m64nNk16 with N = block_m (Mma in marlin_moe_gemm.cuh).
// The last one stages 128 x 256 tiles 4 deep (133 KB at block_m 64): Hopper/Ampere datacenter parts
// hold it, 99 KiB consumer parts (sm_86/89/120) do not, and the chooser must skip it there.
// The order is the "first_valid" baseline's order: small tiles first. backends/marlin/configs.py reads
// this file, so Python and the compiled table cannot disagree.
#pragma once

#define HAL_MARLIN_CONFIGS_FOR_BLOCK(BM)             \
  HAL_MARLIN_CONFIG(BM, 128, 64, 128, 4, 0)          \
  HAL_MARLIN_CONFIG(BM, 64, 128, 128, 4, 0)          \
  HAL_MARLIN_CONFIG(BM, 128, 128, 256, 4, 0)         \
  HAL_MARLIN_CONFIG(BM, 64, 256, 256, 4, 0)          \
  HAL_MARLIN_CONFIG(BM, 64, 256, 128, 3, 0)          \
  HAL_MARLIN_CONFIG(BM, 128, 256, 256, 4, 0)

// bf16 builds for sm_90a (HAL_MARLIN_WGMMA, set by backends/marlin/build.py) add the wgmma configs:
// these four tiles at block_m 48 and 64 (wgmma m64nNk16, N = block_m), each warpgroup owning two
// or four 64-column slabs. At block_m 16 and 32 the same tiles on wgmma were slower than on
// mma.sync at each of the 7 points where the config rule took them (docs/backends/marlin.md).
#define HAL_MARLIN_WGMMA_CONFIGS_FOR_BLOCK(BM)       \
  HAL_MARLIN_CONFIG(BM, 64, 128, 128, 4, 1)          \
  HAL_MARLIN_CONFIG(BM, 64, 256, 256, 4, 1)          \
  HAL_MARLIN_CONFIG(BM, 64, 256, 128, 3, 1)          \
  HAL_MARLIN_CONFIG(BM, 128, 256, 256, 4, 1)

#define HAL_MARLIN_WGMMA_CONFIGS              \
  HAL_MARLIN_WGMMA_CONFIGS_FOR_BLOCK(48)      \
  HAL_MARLIN_WGMMA_CONFIGS_FOR_BLOCK(64)

#if defined(HAL_MARLIN_WGMMA) && HAL_MARLIN_WGMMA
#define HAL_MARLIN_ARCH_CONFIGS HAL_MARLIN_WGMMA_CONFIGS
#else
#define HAL_MARLIN_ARCH_CONFIGS
#endif

#define HAL_MARLIN_ALL_CONFIGS        \
  HAL_MARLIN_CONFIGS_FOR_BLOCK(8)     \
  HAL_MARLIN_CONFIGS_FOR_BLOCK(16)    \
  HAL_MARLIN_CONFIGS_FOR_BLOCK(32)    \
  HAL_MARLIN_CONFIGS_FOR_BLOCK(48)    \
  HAL_MARLIN_CONFIGS_FOR_BLOCK(64)    \
  HAL_MARLIN_ARCH_CONFIGS
