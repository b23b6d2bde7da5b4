"""Every tuning constant and code shared by the Python side and csrc/cpu/moe_brgemm.cpp of the CPU
fused MoE, in one place. The C++ receives them as defines, so the two cannot disagree."""

from __future__ import annotations

# Rows (routes of one expert) per block: two 16-row AMX tiles. With it, the tests' blocks of 4, 5
# and 33 rows land on either side of the BRGEMM threshold and across block boundaries.
BLOCK_M = 32
# Output columns per weight panel: two 16-lane bf16-pair registers in the micro-kernel, one
# 32-column B for BRGEMM (the width known to run through cpublas::brgemm with AMX).
BLOCK_N = 32
# The crossover, in rows: a block of more rows than this goes to BRGEMM (its tile setup and
# panel dequantization are paid back), a block of this many or fewer stays on TinyGEMM.
BRGEMM_MIN_ROWS = 4
# Work items (block run x output panel) each thread should get before runs are split further:
# enough to even out threads when one expert holds the whole batch, few enough that a panel
# dequantized for BRGEMM serves several blocks.
ITEMS_PER_THREAD = 4

# Bytes of L2 one BRGEMM work item may fill with a block of activations plus its group of
# dequantized weight panels: three quarters of the 2 MiB per-core L2 of Sapphire/Emerald Rapids,
# leaving the rest to the output tiles and oneDNN. Every item reads all blocks of its expert run
# again, so the group sets how often activations are re-read: at gpt-oss-20b's 3000 tokens
# (375 rows per expert, K = 2880) a group of 2 gated panel pairs (the half-L2 budget) re-reads
# 3.2 GB of activations per call, more than the L3 keeps once the caches outgrow it; 3 pairs cut
# that by a third (qwen3-30b-a3b stage 1: 5 pairs instead of 3).
BRGEMM_L2_BYTES = 3 << 19
# Upper bound on panels per group (bytes of C scratch per thread grow with it).
MAX_PANEL_GROUP = 8
# Weight bytes per TinyGEMM-only work item (consecutive output panels of one expert, gate and up
# counted together) and the fewest such items per thread a stage keeps. At decode every item streams
# its panels from DRAM and pays the memory latency at its start; single-panel items (24 KiB for
# qwen3-30b-a3b's down projection) paid it every few microseconds. Measured on the Emerald Rapids
# host (16 threads, qwen3-30b-a3b fp8, weights from DRAM): 256 KiB items took a decode call of
# 1-16 tokens 6-8% below single-panel items (docs/backends/cpu_brgemm.md).
TINY_ITEM_BYTES = 256 << 10
TINY_ITEMS_PER_THREAD = 8
# Bytes of activation rows (gather) or fp32 output rows (reduce) per task of the call's queue: a
# decode call copies on one thread, a prefill call spreads the copies over the threads.
COPY_CHUNK_BYTES = 64 << 10
# Spins (pause instructions) a task waits for the tasks it depends on before yielding its core, which
# a thread of the same call may need when there are more threads than cores.
SPINS_BEFORE_YIELD = 1 << 14
# How far ahead of the K pair row being decoded the AVX-512 micro-kernels prefetch the weight
# panel: a decode call reads each panel from DRAM once, and the L2 streamer stops at every 4 KiB
# page. vLLM 0.33.0's CPU kernels prefetch 64 K pair rows ahead (4 KiB of fp8). A work item also
# prefetches (into L2) this much of each weight stream it is about to read before it starts.
PREFETCH_BYTES = 4096

# Bytes of compact caches (gathered activations, intermediate, fp32 output rows: top_k x (6H + 2I)
# per token) one call keeps; a larger call runs in equal token chunks under it. 512 MiB keeps a
# 4800-token qwen3-30b-a3b call in one pass (full expert blocks, weights read once) and caps a
# 64k-token prefill at 0.5 GB instead of 7 GB.
SCRATCH_CAP_BYTES = 512 << 20

# Dispatch policies, numbered as the C++ Policy enum.
POLICIES = ("per_block", "global", "tiny", "brgemm")
DEFAULT_POLICY = "per_block"
BASELINE_POLICY = "global"  # one layer-wide avg_M crossover: `hal bench`'s baseline

# Numbered as the C++ Format and Activation enums.
FORMAT_CODES = {"bf16": 0, "fp8_block128": 1, "mxfp4": 2}
ACTIVATION_CODES = {"silu": 0, "swiglu_oai": 1, "relu2": 2}

# H and I must be whole panels along N and whole mxfp4 scale groups / k-pairs along K.
SIZE_MULTIPLE = 32

# Compile flags per micro-kernel ISA, chosen from the target's capabilities.
ISA_CFLAGS = {
    "avx512bf16": ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mavx2",
                   "-mfma", "-mf16c"),
    "avx2": ("-mavx2", "-mfma", "-mf16c"),
}
