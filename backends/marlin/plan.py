"""The per-call decision of the Marlin MoE kernel, as `kernel.plan(topk_ids)` and `hal select
--tokens N` show it."""

from __future__ import annotations

import attrs
from hal.backends.marlin.configs import GemmChoice


@attrs.frozen
class MarlinPlan:
    tokens: int
    tokens_bucket: int
    block_m: int
    expected_blocks: int  # MoE blocks under uniform routing (the grid is sized for the worst case)
    max_blocks: int
    grid_m: int  # thread blocks along M; each walks the MoE blocks grid_m apart
    gemm13: GemmChoice
    gemm2: GemmChoice
    policy: str  # occupancy | first_valid
    specialization: str  # dtype, kIsEP, kHasBias, arch of the build that runs
    block_m_costs: tuple = ()  # (block_m, modeled cost) priced by the occupancy policy, cheapest first
    fusion: str = "activation"  # configs.FUSIONS: the stages in the GEMM epilogues

    def describe(self) -> str:
        why = ""
        if self.block_m_costs:
            why = " (modeled cost, MB at one SM's bandwidth share: " + ", ".join(
                f"{bm}: {cost / 1e6:.2f}" for bm, cost in self.block_m_costs) + ")"
        head = (f"marlin ({self.specialization}, policy {self.policy}): {self.tokens} tokens "
                f"(bucket {self.tokens_bucket}), block_m {self.block_m}{why}, ~{self.expected_blocks} "
                f"MoE blocks (worst case {self.max_blocks}, grid {self.grid_m} along M); route -> ")
        if self.fusion == "none":
            gemm1 = f"GEMM1 [{self.gemm13.describe()}] -> activation -> "
        else:
            gemm1 = f"GEMM1 + activation [{self.gemm13.describe()}] -> "
        if self.fusion == "activation_and_rounding":
            gemm2 = f"GEMM2 + top-k sum and rounding [{self.gemm2.describe()}]"
        else:
            gemm2 = f"GEMM2 + top-k sum [{self.gemm2.describe()}] -> rounding"
        return head + gemm1 + gemm2
