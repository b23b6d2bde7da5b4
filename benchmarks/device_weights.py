"""Random weights of any weight format made on the benchmark's device, for the GPU benchmarks:
hal.synth quantizes on the host, which takes minutes for the larger layers (mixtral-8x7b's int4
w13 or kimi-k2's fp8 EP rank). Values follow hal.synth's ranges, scaled so each GEMM's outputs are
O(1); the layout is the contract's (docs/contract.md, "Weight formats")."""

from __future__ import annotations

import math

import torch

from hal.spec import FP8_BLOCK, INT4_PACK, MXFP4_GROUP, MoEWeights
from hal.synth import random_expert_map


def device_weights(spec, seed: int, device) -> MoEWeights:
    g = torch.Generator(device=device).manual_seed(seed)
    E, H, I, R = spec.local_experts, spec.hidden_size, spec.intermediate_size, spec.w13_rows
    fmt = spec.weight_format

    def fp8(rows, cols):
        # One expert at a time: the fp32 draw of a whole layer (kimi-k2's EP rank: 5.6 GB for w13)
        # would crowd out other processes compiling on the same GPU.
        w = torch.empty(E, rows, cols, dtype=torch.float8_e4m3fn, device=device)
        for e in range(E):
            w[e] = torch.randn(rows, cols, generator=g, device=device).mul_(64).clamp_(-448, 448)
        s = torch.rand(E, math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK), generator=g,
                       device=device) + 0.5
        return w, s / (64 * math.sqrt(cols))

    def mxfp4(rows, cols):
        q = torch.randint(0, 256, (E, rows, cols // 2), generator=g, device=device, dtype=torch.uint8)
        s = torch.randint(120, 124, (E, rows, cols // MXFP4_GROUP), generator=g, device=device,
                          dtype=torch.uint8)
        return q, s

    def uint4b8(k, n):
        # GPTQ's uint4b8 words along K (any bit pattern is valid) and a bf16 scale per group of K
        # rows (one group over all of K per channel).
        q = torch.randint(-(2 ** 31), 2 ** 31 - 1, (E, k // INT4_PACK, n), generator=g, device=device,
                          dtype=torch.int32)
        s = (torch.rand(E, spec.scale_groups(k), n, generator=g, device=device) + 0.5) / (4.6 * math.sqrt(k))
        return q, s.bfloat16()

    if fmt == "bf16":
        w13 = torch.randn(E, R, H, generator=g, device=device, dtype=torch.bfloat16) / math.sqrt(H)
        w2 = torch.randn(E, H, I, generator=g, device=device, dtype=torch.bfloat16) / math.sqrt(I)
        s13 = s2 = None
    elif fmt == "fp8_block128":
        (w13, s13), (w2, s2) = fp8(R, H), fp8(H, I)
    elif fmt == "mxfp4":
        (w13, s13), (w2, s2) = mxfp4(R, H), mxfp4(H, I)
    elif fmt == "int4_g128":
        (w13, s13), (w2, s2) = uint4b8(H, R), uint4b8(I, H)
    else:
        raise ValueError(f"weight_format={fmt!r}: made here for bf16, fp8_block128, mxfp4 and int4_g128")
    extra = {}
    if spec.has_bias:
        extra = dict(b13=torch.randn(E, R, generator=g, device=device) * 0.1,
                     b2=torch.randn(E, H, generator=g, device=device) * 0.1)
    if spec.is_ep:
        extra["expert_map"] = random_expert_map(spec, seed=seed + 1, device=device)
    return MoEWeights(w13=w13, w2=w2, w13_scale=s13, w2_scale=s2, **extra)
