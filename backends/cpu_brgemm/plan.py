"""What one call of the CPU fused MoE will do: its expert blocks and the GEMM path of each, as the
C++ decides them (route_plan runs the kernel's own routing and predicate)."""

from __future__ import annotations

from collections import Counter

import attrs

PATH_NAMES = ("tiny", "brgemm")  # C++ Path enum order


@attrs.frozen
class BlockPlan:
    expert: int  # local expert id
    start: int  # first row of the block in its pass's sorted (compact) caches
    m_size: int  # routes in the block, 1..BLOCK_M
    n_size: int  # output columns per panel
    stage1: str  # "brgemm" | "tiny" for x @ W13
    stage2: str  # "brgemm" | "tiny" for act @ W2


@attrs.frozen
class MoEPlan:
    policy: str
    isa: str
    brgemm_supported: bool
    tokens: int
    local_routes: int
    blocks: tuple = attrs.field(converter=tuple)  # of BlockPlan, by pass, within one sorted by expert
    assumed_expert_map: bool = False  # EP without a map: this rank taken as experts [0, n_local)
    passes: int = 1  # equal token chunks the call runs in, to keep its scratch under the cap

    def path_counts(self) -> dict:
        """(stage1, stage2) path -> number of blocks."""
        return dict(Counter((b.stage1, b.stage2) for b in self.blocks))

    def describe(self) -> str:
        experts = len({b.expert for b in self.blocks})
        brgemm = sum(b.stage1 == "brgemm" for b in self.blocks)
        head = (f"cpu_brgemm plan: policy={self.policy}, TinyGEMM {self.isa}, BRGEMM "
                f"{'available (AMX)' if self.brgemm_supported else 'not available'}; "
                f"{self.tokens} tokens" + (f" in {self.passes} passes" if self.passes > 1 else "")
                + f", {self.local_routes} local routes in {len(self.blocks)} "
                f"blocks over {experts} experts: {brgemm} on BRGEMM, {len(self.blocks) - brgemm} "
                "on TinyGEMM (both stages)"
                + ("; no expert_map given: local experts assumed to be global ids [0, n_local)"
                   if self.assumed_expert_map else ""))
        rows = [f"  expert {b.expert:4d}  m={b.m_size:3d} n={b.n_size}  stage1={b.stage1:6s} "
                f"stage2={b.stage2}" for b in self.blocks]
        return "\n".join([head, *rows])
