"""The per-call decision of the Triton MoE kernel, as `kernel.plan(topk_ids)` and `hal select
--tokens N` show it."""

from __future__ import annotations

import attrs
from hal.backends.triton_moe.configs import FP8_TERMS, LaunchConfig


@attrs.frozen
class TritonMoEPlan:
    tokens: int
    config: LaunchConfig
    max_blocks: int  # the GEMM grid along M: every routing of `tokens` tokens fits (0: GEMV path)
    launches: int  # dependent kernel launches per call
    weight_path: str  # how the weights reach the tensor cores

    def describe(self) -> str:
        c = self.config
        why = "; ".join(c.reasons)
        if c.gemv1 is not None:
            return (f"triton_moe: {self.tokens} tokens (bucket {c.tokens_bucket}), {self.launches} launches: "
                    f"GEMV1 [{c.gemv1.describe()}] per route + activation -> GEMV2 [{c.gemv2.describe()}] "
                    f"per token, x topk weight, summed over its routes; {self.weight_path}. Why: {why}")
        grouping = (f"one BLOCK_M {c.block_m} block per route (grid {self.max_blocks})" if c.per_route else
                    f"align routes into BLOCK_M {c.block_m} blocks (grid {self.max_blocks})")
        if c.fp8_act and c.per_route:
            grouping = f"quantize x to {FP8_TERMS[c.act_terms]} per 128 columns -> " + grouping
        elif c.fp8_act:
            grouping += f" and quantize x to {FP8_TERMS[c.act_terms]} per 128 columns in the same launch"
        return (f"triton_moe: {self.tokens} tokens (bucket {c.tokens_bucket}), {self.launches} launches: "
                f"{grouping} -> GEMM1 "
                f"[{c.gemm1.describe()}] + activation -> GEMM2 [{c.gemm2.describe()}] x topk weight -> "
                f"top-k sum; {self.weight_path}. Why: {why}")
