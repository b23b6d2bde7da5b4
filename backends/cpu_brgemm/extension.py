"""Builds csrc/cpu/moe_brgemm.cpp for one ISA (hal.jit caches it per specialization) and returns
its op namespace."""

from __future__ import annotations

import functools
from typing import Optional

from hal.backends.cpu_brgemm import policy

SOURCE = "cpu/moe_brgemm.cpp"


# AddressSanitizer build for tests: its own specialization, loadable only in a process that has
# libasan preloaded (the .so leaves the runtime's symbols to it). -O1 keeps the build short.
SANITIZER_CFLAGS = {"address": ("-fsanitize=address", "-fno-omit-frame-pointer", "-O1")}


@functools.cache
def ops(isa: str, sanitizer: Optional[str] = None):
    """torch.ops namespace with fused_moe, route_plan, brgemm_packs_bf16, isa_name, decode_fp8 and
    the scratch ops (release_scratch, scratch_bytes), which hal.release_scratch reaches through the
    holder registered here."""
    import torch

    from hal import jit, scratch

    if isa not in policy.ISA_CFLAGS:
        raise ValueError(f"isa={isa!r} is not allowed: expected one of {', '.join(policy.ISA_CFLAGS)}")
    if sanitizer is not None and sanitizer not in SANITIZER_CFLAGS:
        raise ValueError(f"sanitizer={sanitizer!r} is not allowed: expected None or "
                         f"{', '.join(SANITIZER_CFLAGS)}")
    namespace = jit.build(
        f"cpu_brgemm_{isa}" + (f"_{sanitizer}" if sanitizer else ""), [SOURCE],
        defines=dict(MOE_BLOCK_M=policy.BLOCK_M, MOE_BLOCK_N=policy.BLOCK_N,
                     MOE_BRGEMM_MIN_ROWS=policy.BRGEMM_MIN_ROWS,
                     MOE_ITEMS_PER_THREAD=policy.ITEMS_PER_THREAD,
                     MOE_BRGEMM_L2_BYTES=policy.BRGEMM_L2_BYTES,
                     MOE_MAX_PANEL_GROUP=policy.MAX_PANEL_GROUP,
                     MOE_PREFETCH_BYTES=policy.PREFETCH_BYTES,
                     MOE_TINY_ITEM_BYTES=policy.TINY_ITEM_BYTES,
                     MOE_TINY_ITEMS_PER_THREAD=policy.TINY_ITEMS_PER_THREAD,
                     MOE_COPY_CHUNK_BYTES=policy.COPY_CHUNK_BYTES,
                     MOE_SPINS_BEFORE_YIELD=policy.SPINS_BEFORE_YIELD),
        extra_cflags=policy.ISA_CFLAGS[isa] + SANITIZER_CFLAGS.get(sanitizer, ()))
    built = getattr(torch.ops, namespace)
    scratch.register(f"cpu_brgemm {isa}" + (f" {sanitizer}" if sanitizer else ""), built.release_scratch,
                     built.scratch_bytes)
    return built


@functools.cache
def traced_ops(isa: str, sanitizer: Optional[str] = None):
    """The twins of fused_moe and route_plan that torch.compile traces (hal.traceable)."""
    from hal import traceable

    return traceable.twins(ops(isa, sanitizer).name, FAKES)


# Fake kernels of the tensor ops, for torch.compile. brgemm_packs_bf16 and isa_name take and return
# no tensor: tracing runs them as they are.
def _fused_moe_fake(x, topk_weights, topk_ids, expert_map, w13, w13_scale, w2, w2_scale, b13, b2,
                    out, weight_format, activation, swiglu_alpha, swiglu_limit, policy_index,
                    brgemm_supported, max_chunk_tokens) -> None:
    """Writes out in place (declared Tensor(a!)) and returns nothing."""


def _route_plan_fake(topk_ids, expert_map, local_experts, policy_index, brgemm_supported,
                     max_chunk_tokens):
    """int32 [blocks, 6]: the block count depends on the ids' values."""
    import torch

    blocks = torch.library.get_ctx().new_dynamic_size()
    return topk_ids.new_empty((blocks, 6), dtype=torch.int32)


FAKES = {"fused_moe": _fused_moe_fake, "route_plan": _route_plan_fake}
