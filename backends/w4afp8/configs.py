"""Launch rules of the W4A8 grouped GEMMs: the tile for a batch and the m-grid over the masked layout.
Plain Python (no torch, no Triton), so plans are made and tested anywhere.

The GEMMs read int4 weights (half a byte per element) and, in decode, a handful of rows per expert:
they are weight-bandwidth-bound until an expert has about a hundred rows. The tile therefore follows
the rows an expert is expected to hold: a narrow M tile in decode, so no MMA work is spent on rows
that do not exist, and a wide one in prefill, where each weight tile is reused by more rows."""

from __future__ import annotations

from typing import Optional

import attrs

# elements along K per MMA step: one int4 scale group (and one DeepEP activation scale group), so
# each step's fp32 partial sum is scaled once by its group's bf16 weight scale.
GROUP_K = 128

# rows per expert (upper bound, inclusive) -> (BLOCK_M, BLOCK_N, num_warps). BLOCK_M is at least
# 16, the smallest M of an FP8 MMA instruction on NVIDIA and AMD. BLOCK_N 64 keeps two fp32
# accumulators (gate and up) of a 128-row tile at 64 registers per lane on 8 warps, and gives a
# decode batch of 8 experts x 2048 / 64 = 256 programs for GEMM 1, about two per SM on an H200.
TILES = (
    (16, (16, 64, 4)),
    (32, (32, 64, 4)),
    (64, (64, 64, 4)),
    (None, (128, 64, 8)),
)
# rows: the M of one warpgroup MMA (wgmma, sm_90). Triton lowers an FP8 dot with a smaller M to f16
# mma.sync on sm_90, so on GPUs with wgmma the tile never goes below it: the MMA stays FP8, and the
# rows it computes beyond masked_m cost nothing next to the weight stream of a decode step.
WGMMA_MIN_M = 64
# software-pipeline depth of the K loop: the weight stream is what the loop waits on, so NVIDIA
# keeps three groups in flight; AMD's Triton pipeliner is tuned for two stages.
STAGES = {"nvidia": 3, "amd": 2}
# rows: an expert is expected to hold up to this many times the average before the m-grid stops
# growing with it; rows beyond that are walked by the same programs in a loop (never dropped).
ROW_SLACK = 2


# rows per expert (upper bound, inclusive) served by the decode GEMMs (triton_decode): the weight
# tile is the MMA's M side, the rows its N side (bf16 MMA of exact int4 and FP8 values), so 16 rows
# fill an MMA where sm_90's FP8 wgmma needs 64. -> (BLOCK_M, BLOCK_N, num_warps, num_stages)
DECODE_TILES = (
    (16, (16, 64, 4, 4)),
    (32, (32, 64, 4, 4)),
)
# Split K of the transposed GEMMs: a decode grid (experts x n-blocks) too small to fill the GPU
# gets K split over more programs, up to this many resident on each SM (4-warp programs holding
# 41-51 KB of shared memory), each split keeping at least MIN_GROUPS_PER_SPLIT groups of 128.
RESIDENT_PROGRAMS_PER_SM = 4
MAX_SPLIT_K = 8
MIN_GROUPS_PER_SPLIT = 4
# path -> what runs
PATHS = {
    "decode": "transposed bf16 MMA (weights on M, rows on N), int4 and FP8 converted exactly",
    "transposed_fp8": "transposed FP8 MMA (weights on M, rows on N), int4 unpacked to FP8",
    "fp8": "FP8 MMA (rows on M), int4 unpacked to FP8",
}


@attrs.frozen
class GemmTile:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    path: str = "fp8"  # a key of PATHS

    @property
    def transposed(self) -> bool:
        """Weights on the MMA's M side (triton_decode), rows on its N side."""
        return self.path != "fp8"

    def describe(self) -> str:
        return (f"{self.path} path ({PATHS[self.path]}), tile {self.block_m} rows x {self.block_n} "
                f"columns x {GROUP_K}, {self.num_warps} warps, {self.num_stages} stages")


def gemm_tile(rows_per_expert: int, vendor: Optional[str], wgmma: bool = False) -> GemmTile:
    """The tile for experts expected to hold `rows_per_expert` rows on a GPU of `vendor` (None for
    the interpreter), with warpgroup MMA or not."""
    for bound, (block_m, block_n, warps, stages) in DECODE_TILES:
        if rows_per_expert <= bound:
            return GemmTile(block_m, block_n, warps, min(stages, STAGES.get(vendor or "", stages)),
                            "decode")
    stages = STAGES.get(vendor or "", STAGES["nvidia"])
    for bound, (block_m, block_n, warps) in TILES:
        if bound is None or rows_per_expert <= bound:
            return GemmTile(max(block_m, WGMMA_MIN_M) if wgmma else block_m, block_n, warps, stages)
    raise AssertionError("TILES ends with an unbounded row")


def rows_hint(max_m: int, expected_rows: Optional[int]) -> int:
    """Rows per expert the launch is sized for: the dispatcher's estimate with slack, or max_m
    when there is none. Never more than max_m, never less than 1."""
    if expected_rows is None:
        return max(max_m, 1)
    return max(1, min(max_m, ROW_SLACK * expected_rows))


def m_grid(max_m: int, expected_rows: Optional[int], block_m: int) -> int:
    """Programs per expert along rows. Program p takes the m-blocks p, p + m_grid, ... that lie
    below masked_m[e]; one whose first block is already past masked_m exits at once."""
    return max(1, -(-rows_hint(max_m, expected_rows) // block_m))


def split_k(programs: int, k_groups: int, sm_count: Optional[int]) -> int:
    """K splits (a power of two) for a transposed GEMM of `programs` programs (experts x n-blocks x
    m-programs) over `k_groups` groups of 128 on `sm_count` SMs; 1 where the SM count is unknown."""
    if not sm_count:
        return 1
    split = 1
    while (split < MAX_SPLIT_K and programs * split * 2 <= RESIDENT_PROGRAMS_PER_SM * sm_count
           and k_groups // (split * 2) >= MIN_GROUPS_PER_SPLIT):
        split *= 2
    return split
