"""Builds csrc/cpu/moe_brgemm.cpp for one ISA (hal.jit caches it per specialization) and returns
its op namespace."""

from __future__ import annotations

import functools

from backends.cpu_brgemm import policy

SOURCE = "cpu/moe_brgemm.cpp"


@functools.cache
def ops(isa: str):
    """torch.ops namespace with fused_moe, route_plan, brgemm_packs_bf16 and isa_name."""
    import torch

    from hal import jit

    if isa not in policy.ISA_CFLAGS:
        raise ValueError(f"isa={isa!r} is not allowed: expected one of {', '.join(policy.ISA_CFLAGS)}")
    namespace = jit.build(
        f"cpu_brgemm_{isa}", [SOURCE],
        defines=dict(MOE_BLOCK_M=policy.BLOCK_M, MOE_BLOCK_N=policy.BLOCK_N,
                     MOE_BRGEMM_MIN_ROWS=policy.BRGEMM_MIN_ROWS,
                     MOE_ITEMS_PER_THREAD=policy.ITEMS_PER_THREAD,
                     MOE_BRGEMM_L2_BYTES=policy.BRGEMM_L2_BYTES,
                     MOE_MAX_PANEL_GROUP=policy.MAX_PANEL_GROUP),
        extra_cflags=policy.ISA_CFLAGS[isa])
    return getattr(torch.ops, namespace)
