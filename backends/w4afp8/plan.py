"""The per-call decision of the W4AFP8 masked layer, as `kernel.plan()` returns it and `hal select`
prints it: which feed runs GEMM 1 and why, the GEMM tile, and the grids."""

from __future__ import annotations

from typing import Optional

import attrs
from hal.backends.w4afp8.configs import GemmTile

# variant name -> what feeds GEMM 1
FEEDS = {
    "fused": "GEMM 1 reads DeepEP's per-token-group FP8 and requantizes it to per-tensor FP8 with "
             "w13_input_scale in registers before its MMA",
    "requant": "the requant op rewrites x to per-tensor FP8 with w13_input_scale, then GEMM 1 reads it",
}
# the requant feed on the folded path
FOLDED_REQUANT_FEED = ("w4afp8's requant launch rewrites x to per-tensor FP8 values with "
                       "w13_input_scale, written as fp16 for the fp16 MMA, then GEMM 1 reads it")
# why each variant is the one that runs when it is
WHY = {
    "requant": "default: on an H200 the fused feed was within 1% at 8 experts x 1-8 rows and "
               "2-65% slower at every other benchmarked point (8 and 32 experts, 1-512 rows), "
               "same bytes",
    "fused": "named as the baseline of the requant feed (kernel.baselines()): one launch and one "
             "[E, max_m, H] FP8 write and read fewer, but a slower GEMM 1 main loop",
}

# tile rule -> why it runs (configs.TILE_RULE and TILES carry the figures)
RULE_WHY = {
    "transposed": "tile rule 'transposed' (default): weights on the MMA's M side and the rows on "
                  "its N side: fp16 mma.sync on nibble planes unpacked in registers up to 32 rows, "
                  "beyond (on GPUs with wgmma) an fp16 MMA on weights with their scales folded in, as "
                  "measured on an H200",
    "per_group": "tile rule 'per_group' (baseline of the folded path, and the rule for weights it "
                 "cannot fold): as 'transposed' up to 32 rows, beyond each K group's MMA result scaled "
                 "by its weight scale: bf16 MMA with the lop3 unpack up to 64 rows, FP8 MMA beyond",
    "rows_on_m": "tile rule 'rows_on_m' (baseline, the previous tiles): rows on the FP8 MMA's M "
                 "side, never below 64 rows on GPUs with warpgroup MMA",
}


@attrs.frozen
class W4AFp8Plan:
    variant: str  # "fused" | "requant"
    rule: str  # a key of RULE_WHY
    tile: GemmTile
    m_programs: int  # programs per expert along rows
    gemm1_n_blocks: int
    gemm2_n_blocks: int
    num_experts: int
    max_m: int
    expected_rows: Optional[int]
    mma_dtype: str  # the MMA operand dtype: FP8, bf16 or fp16 by path, fp32 under the Triton interpreter
    split_k: tuple  # K splits of (GEMM 1, GEMM 2)
    live_experts: Optional[int]
    rows: Optional[int]
    requant: Optional[object]  # the requant op's own plan, for the requant feed

    @property
    def programs(self) -> int:
        blocks = self.gemm1_n_blocks * self.split_k[0] + self.gemm2_n_blocks * self.split_k[1]
        return self.m_programs * blocks * self.num_experts

    def describe(self) -> str:
        live = "" if self.rows is None else f"{self.rows} rows on {self.live_experts} live experts; "
        requant = "" if self.requant is None else f"; requant: {self.requant.describe()}"
        folded = self.tile.path == "folded"
        feed = FOLDED_REQUANT_FEED if folded and self.variant == "requant" else FEEDS[self.variant]
        scales = ("the weight scales folded into the fp16 weights, one fp32 accumulation over K" if folded
                  else "fp32 accumulation scaled per K group of 128")
        return (f"w4afp8 masked MoE, feed {self.variant}: {feed} ({WHY[self.variant]}); "
                f"{live}int4 g128 x {self.mma_dtype} MMA, {scales}; "
                f"{RULE_WHY[self.rule]}: {self.tile.describe()}, sized for expected rows "
                f"{self.expected_rows} of max_m "
                f"{self.max_m}; grids {self.m_programs} x {self.gemm1_n_blocks} x {self.num_experts} "
                f"x {self.split_k[0]} K splits (GEMM 1 + activation + FP8 requant) and {self.m_programs} "
                f"x {self.gemm2_n_blocks} x {self.num_experts} x {self.split_k[1]} K splits (GEMM 2, "
                f"bf16); m-programs past masked_m exit at once{requant}")
