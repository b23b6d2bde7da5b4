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

# The tile rule ("transposed", the default): rows per expert (upper bound, inclusive) -> (path,
# BLOCK_M, BLOCK_N, num_warps, num_stages). Every path puts the weight tile on the MMA's M side and
# the rows on its N side, so BLOCK_M covers an expert's rows in one m-block (each further m-block
# streams the expert's weights again) without padding them to a 64-row FP8 wgmma. Up to 32 rows
# the "planes" path (triton_planes.py): one or two warps of fp16 mma.sync that unpack the int4 in
# registers. Measured on an H200 (docs/backends/w4afp8.md), 8 experts x 8 rows, GEMM 1 + GEMM 2: 16
# x 64 decode 88.4 + 46.7 us, planes 8 x 64 on two warps 47.6 + 21.6 us (3 / 1 K splits), 8 x 32 on
# one warp 39.1 + 22.5 us; 16 rows: 16 x 64 decode 88.6 + 46.9 us, planes 16 x 64 60.0 + 29.5 us. 32
# rows, the whole layer: planes 32 x 32 on two warps (235 registers, no spills; 32 x 64 spills, on 4
# stages) 129.7 us against 168.3 for the per-group 32 x 64 bf16 wgmma tile (8 experts), 469.1
# against 606.4 (32 experts); on an H100, 3 stages against 4: 124.2 / 125.5 against 130.5 / 132.3 us
# (8 experts x 24 / 32 rows), 454.8 / 471.1 against 470.3 / 489.0 (32 experts), where 16 x 64 tiles
# over two m-blocks tied 4 stages (126.3 / 127.1, 472.6 / 489.4). At 64 rows planes lost (232.4 us,
# and 206.4 for 64 x 32, against 198.5 folded). From 33 rows the "folded" path (triton_decode.py):
# the weight scales folded exactly into fp16 weight tiles, so the MMAs chain over K and stay in
# flight, reading 16-bit activations from memory. That pays where the MMA is asynchronous (wgmma,
# sm_90); elsewhere (mma.sync, MFMA) an MMA's result is waited for anyway and the FP8 MMA runs at
# twice the fp16 rate, so GPUs without wgmma, and weights whose scales cannot be folded exactly,
# take PER_GROUP_RULE's tile instead.
# Measured on an H200, 8 experts, the whole layer (benchmarks/w4afp8_masked.py --tile): 32 rows
# per-group 32 x 64 168.4 us, folded 32 x 64 on 3 / 4 stages 167.0 / 179.6; 64 rows per-group
# 209.1, folded 64 x 64 4 warps 3 stages 199.7, 64 x 128 8 warps 251.9; 128 rows per-group (FP8
# 128 x 64) 370.2, folded 128 x 128 8 warps 318.5, 128 x 64 4 / 8 warps 401.7 / 439.7; 512 rows
# per-group (FP8 256 x 64) 1027.1, folded 128 x 128 984.2, 256 x 64 3 / 2 stages 992.3 / 1161.9.
# On an H100 at 64 rows, folded 64 x 64 on 4 warps: 3 stages 198.0 us, 4 stages 212.3; 64 x 128 on
# 4 / 8 warps 273.0 / 302.8; 64 x 32 361.3.
TILE_RULE = (
    (8, ("planes", 8, 32, 1, 4)),
    (16, ("planes", 16, 64, 2, 4)),
    (32, ("planes", 32, 32, 2, 3)),
    (64, ("folded", 64, 64, 4, 3)),
    (None, ("folded", 128, 128, 8, 3)),
)
# The per-group rule ("per_group", the baseline of the folded path, and the rule for weights it
# cannot fold): from 33 rows each K group's MMA result is scaled by its group's weight scale, so
# every group waits for its MMA: a bf16 wgmma with Marlin's lop3 unpack up to 64 rows, beyond an
# FP8 MMA, whose rate pays for its slower unpack.
PER_GROUP_RULE = TILE_RULE[:3] + (
    (64, ("decode", 64, 64, 4, 4)),
    (128, ("transposed_fp8", 128, 64, 4, 3)),
    (None, ("transposed_fp8", 256, 64, 8, 3)),
)

# rows: the smallest N of an AMD matrix core instruction (MFMA 16x16); Triton lowers a dot with
# fewer rows on the N side to FMAs on gfx942, so the AMD tiles never go below it.
MFMA_MIN_N = 16

# The previous rule ("rows_on_m", kept as the baseline): the rows on the FP8 MMA's M side.
# rows per expert (upper bound, inclusive) -> (BLOCK_M, BLOCK_N, num_warps); BLOCK_M never below
# WGMMA_MIN_M on GPUs with warpgroup MMA.
TILES = (
    (16, (16, 64, 4)),
    (32, (32, 64, 4)),
    (64, (64, 64, 4)),
    (None, (128, 64, 8)),
)
# rows: the M of one warpgroup MMA (wgmma, sm_90). Triton lowers an FP8 dot with a smaller M to f16
# mma.sync on sm_90, so on GPUs with wgmma the rows-on-M tile never goes below it.
WGMMA_MIN_M = 64
# software-pipeline depth of the rows-on-M K loop: NVIDIA keeps three groups in flight; AMD's
# Triton pipeliner is tuned for two stages, which caps every rule there.
STAGES = {"nvidia": 3, "amd": 2}
# rows: an expert is expected to hold up to this many times the average before the m-grid stops
# growing with it; rows beyond that are walked by the same programs in a loop (never dropped).
ROW_SLACK = 2
RULES = ("transposed", "per_group", "rows_on_m")
# the transposed rules' tables
TRANSPOSED_RULES = {"transposed": TILE_RULE, "per_group": PER_GROUP_RULE}

# Split K of the transposed GEMMs: a grid (experts x n-blocks x m-programs) too small to fill the
# GPU gets K split over more programs, up to this many resident on each SM (4-warp programs holding
# 41-51 KB of shared memory), each split keeping at least MIN_GROUPS_PER_SPLIT groups of 128. At
# most two splits: their fp32 sums added in either order give the same value, so the output bytes
# do not depend on which split arrives first (from three on they would); on an H200, 8 experts x 8
# rows took 143 / 138 / 140 us at 1 / 2 / 4 splits.
RESIDENT_PROGRAMS_PER_SM = 4
MAX_SPLIT_K = 2
MIN_GROUPS_PER_SPLIT = 4
# Split K of the planes path: every split stores its fp32 partial tile in its own workspace slot and
# the last to arrive sums them in split order, so any number of splits writes the same bytes. The
# grid is split until it fills PLANES_WARPS_PER_SM warps on every SM (12 programs of 150-170
# registers fit; two thirds of that measured best), each split keeping at least
# MIN_GROUPS_PER_SPLIT groups of 128. On an H200, 8 experts x 8 rows, GEMM 1 (56 groups) at 8 x 32
# on one warp: 44.9 / 37.1 / 38.8 / 41.3 us at 1 / 2 / 3 / 4 splits; GEMM 2 (16 groups, already
# 1792 programs) 22.6 us unsplit, 28.3 us in two. 8 x 64 on two warps: GEMM 1 41.7 / 47.6 / 42.2 /
# 49.8 us at 1 / 3 / 4 / 8 splits, GEMM 2 21.6 / 27.1 / 29.9 / 34.9 us at 1 / 2 / 4 / 8.
PLANES_WARPS_PER_SM = 8
MAX_PLANES_SPLIT_K = 8
# path -> what runs
PATHS = {
    "planes": "transposed fp16 MMA (weights on M, rows on N) by nibble planes, unpacked in registers",
    "decode": "transposed bf16 MMA (weights on M, rows on N), int4 and FP8 converted exactly",
    "folded": ("transposed fp16 MMA (weights on M, rows on N), the weight scales folded exactly into the "
               "weights, FP8 activations read as fp16"),
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
    max_registers: Optional[int] = None  # per thread (NVIDIA's maxnreg); None: the compiler's choice

    @property
    def transposed(self) -> bool:
        """Weights on the MMA's M side (triton_decode), rows on its N side."""
        return self.path != "fp8"

    def describe(self) -> str:
        registers = "" if self.max_registers is None else f", at most {self.max_registers} registers"
        return (f"{self.path} path ({PATHS[self.path]}), tile {self.block_m} rows x {self.block_n} "
                f"columns x {GROUP_K}, {self.num_warps} warps, {self.num_stages} stages{registers}")


def gemm_tile(rows_per_expert: int, vendor: Optional[str], wgmma: bool = False,
              rule: str = "transposed") -> GemmTile:
    """The tile for experts expected to hold `rows_per_expert` rows on a GPU of `vendor` (None for
    the interpreter), with warpgroup MMA or not, under `rule` (one of RULES)."""
    cap = STAGES["amd"] if vendor == "amd" else None
    if rule in TRANSPOSED_RULES:
        table = TRANSPOSED_RULES[rule if wgmma else "per_group"]
        for bound, (path, block_m, block_n, warps, stages) in table:
            if bound is None or rows_per_expert <= bound:
                if vendor == "amd":
                    block_m = max(block_m, MFMA_MIN_N)
                return GemmTile(block_m, block_n, warps, min(stages, cap or stages), path)
        raise AssertionError("TILE_RULE ends with an unbounded row")
    if rule != "rows_on_m":
        raise ValueError(f"rule={rule!r} is not allowed: expected one of {RULES}")
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


def tile_rows(max_m: int, expected_rows: Optional[int], rule: str) -> int:
    """Rows per expert the tile is chosen for. The transposed rule takes the estimate itself (capped
    by max_m), so a uniform batch fits one m-block: sizing the tile for the slack of the m-grid would
    put 64 expected rows on a 128-row FP8 tile. The rows-on-M baseline keeps its rule, rows_hint."""
    if rule == "rows_on_m" or expected_rows is None:
        return rows_hint(max_m, expected_rows)
    return max(1, min(max_m, expected_rows))


def m_grid(max_m: int, expected_rows: Optional[int], block_m: int, path: str = "fp8") -> int:
    """Programs per expert along rows. Program p takes the m-blocks p, p + m_grid, ... that lie
    below masked_m[e]; one whose first block is already past masked_m exits at once. The planes
    path sizes the grid for the estimate itself (tile_rows), without the slack: its programs are
    one or two warps, K-split, so the slack's programs that exit at once were thousands (8
    experts x 8 rows on an H200, the whole layer: 75.3 us with the slack, 61.3 us without)."""
    if path == "planes":
        return max(1, -(-tile_rows(max_m, expected_rows, "transposed") // block_m))
    return max(1, -(-rows_hint(max_m, expected_rows) // block_m))


def planes_split_k(programs: int, num_warps: int, k_groups: int, sm_count: Optional[int]) -> int:
    """K splits for a planes GEMM of `programs` programs of `num_warps` warps (experts x n-blocks x
    m-programs) over `k_groups` groups of 128 on `sm_count` SMs; 1 where the SM count is
    unknown."""
    if not sm_count:
        return 1
    fill = PLANES_WARPS_PER_SM // num_warps * sm_count // max(programs, 1)
    return max(1, min(MAX_PLANES_SPLIT_K, fill, k_groups // MIN_GROUPS_PER_SPLIT))


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
