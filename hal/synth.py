"""Random but realistic inputs for tests and benchmarks: weights in every checkpoint format, routing
with a chosen shape, EP maps, and DeepEP masked activations. Never zeros: zeros hide unwritten
outputs and wrong indexing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch

from hal.spec import FP8_BLOCK, INT4_PACK, MXFP4_GROUP, TOKEN_GROUP, MoESpec, MoEWeights

# fp8 weights: most values in e4m3's normal range, a few in its subnormal range and at zero, so
# kernels are checked on the encodings fast converters get wrong.
FP8_NORMAL_STD = 64.0
FP8_TINY_FRACTION = 0.05
FP8_TINY_STD = 0.004  # below 2^-6, e4m3's smallest normal
# mxfp4: e8m0 exponents a little under 127, so 6 x 2^-k keeps GEMM outputs O(1) at K in the
# thousands.
MXFP4_EXPONENTS = (120, 124)
CONCENTRATED_EXPERT_FRACTION = 0.10  # "80% of routes on 10% of the experts"
CONCENTRATED_ROUTE_FRACTION = 0.80


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _fp8_block(rows, cols, E, g):
    w = torch.randn(E, rows, cols, generator=g) * FP8_NORMAL_STD
    tiny = torch.rand(E, rows, cols, generator=g) < FP8_TINY_FRACTION
    w = torch.where(tiny, torch.randn(E, rows, cols, generator=g) * FP8_TINY_STD, w)
    q = w.clamp(-448, 448).to(torch.float8_e4m3fn)
    s = (torch.rand(E, math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK), generator=g) + 0.5)
    return q, s / (FP8_NORMAL_STD * math.sqrt(cols))


def _mxfp4(rows, cols, E, g):
    q = torch.randint(0, 256, (E, rows, cols // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    s = torch.randint(*MXFP4_EXPONENTS, (E, rows, cols // MXFP4_GROUP), generator=g,
                      dtype=torch.int32).to(torch.uint8)
    return q, s


def _uint4b8(rows, cols, E, groups, dtype, g):
    """GPTQ container for a [rows, cols] weight: qweight [E, cols/8, rows], scales [E, G, rows]."""
    q = torch.randint(-2**31, 2**31 - 1, (E, cols // INT4_PACK, rows), generator=g, dtype=torch.int64)
    s = (torch.rand(E, groups, rows, generator=g) + 0.5) / (4 * math.sqrt(cols))
    return q.to(torch.int32), s.to(dtype)


def random_weights(spec: MoESpec, device="cpu", seed: int = 0) -> MoEWeights:
    g = _gen(seed)
    E, H, I, R = spec.local_experts, spec.hidden_size, spec.intermediate_size, spec.w13_rows
    fmt = spec.weight_format
    extra = {}
    if fmt == "bf16":
        w13 = (torch.randn(E, R, H, generator=g) / math.sqrt(H)).bfloat16()
        w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).bfloat16()
        s13 = s2 = None
    elif fmt == "fp8_block128":
        w13, s13 = _fp8_block(R, H, E, g)
        w2, s2 = _fp8_block(H, I, E, g)
    elif fmt == "mxfp4":
        w13, s13 = _mxfp4(R, H, E, g)
        w2, s2 = _mxfp4(H, I, E, g)
    else:
        dtype = torch.bfloat16 if fmt == "w4afp8" else getattr(torch, spec.act_dtype)
        w13, s13 = _uint4b8(R, H, E, spec.scale_groups(H), dtype, g)
        w2, s2 = _uint4b8(H, I, E, spec.scale_groups(I), dtype, g)
        if fmt == "w4afp8":
            # Static scales as calibration would set them for the activations random_masked_inputs
            # makes: |x| up to ~9 before GEMM 1, activations O(1) before GEMM 2.
            extra = dict(w13_input_scale=torch.tensor(9.0 / 448), w2_input_scale=torch.tensor(4.0 / 448))
    if spec.has_bias:
        extra["b13"] = torch.randn(E, R, generator=g) * 0.1
        extra["b2"] = torch.randn(E, H, generator=g) * 0.1
    tensors = dict(w13=w13, w2=w2, w13_scale=s13, w2_scale=s2, **extra)
    return MoEWeights(**{k: None if v is None else v.to(device) for k, v in tensors.items()})


def random_expert_map(spec: MoESpec, seed: int = 0, device="cpu") -> torch.Tensor:
    """Global id -> local id for spec.local_experts experts scattered over the global range, -1 for
    the rest."""
    g = _gen(seed)
    chosen = torch.randperm(spec.num_experts, generator=g)[: spec.local_experts]
    expert_map = torch.full((spec.num_experts,), -1, dtype=torch.int32)
    expert_map[chosen] = torch.arange(spec.local_experts, dtype=torch.int32)
    return expert_map.to(device)


def _topk_weights(M, k, g):
    return torch.softmax(torch.randn(M, k, generator=g), dim=-1).float()


def random_routing(spec: MoESpec, num_tokens: int, mode: str = "uniform", seed: int = 0,
                   device="cpu", hot_expert: int = 0, counts: Optional[Sequence[int]] = None):
    """(topk_weights fp32 [M, k], topk_ids int32 [M, k]); ids are distinct within a row.

    uniform       every expert equally likely
    concentrated  about 80% of routes on 10% of the experts
    one_expert    slot 0 of every token on `hot_expert`, other slots uniform elsewhere
    counts        expert e receives exactly counts[e] routes (len == num_experts,
                  sum == num_tokens * top_k, each count <= num_tokens)
    """
    g = _gen(seed)
    E, k, M = spec.num_experts, spec.top_k, num_tokens
    if mode == "uniform":
        ids = torch.rand(M, E, generator=g).topk(k, dim=1).indices
    elif mode == "concentrated":
        hot = max(1, round(E * CONCENTRATED_EXPERT_FRACTION))
        probs = torch.full((E,), (1 - CONCENTRATED_ROUTE_FRACTION) / max(E - hot, 1))
        probs[:hot] = CONCENTRATED_ROUTE_FRACTION / hot
        perm = torch.randperm(E, generator=g)
        ids = perm[torch.multinomial(probs.expand(M, E), k, replacement=False, generator=g)] \
            if M else torch.empty(0, k, dtype=torch.long)
    elif mode == "one_expert":
        others = torch.rand(M, E, generator=g)
        others[:, hot_expert] = -1.0
        ids = torch.cat([torch.full((M, 1), hot_expert), others.topk(k - 1, dim=1).indices], dim=1)
    elif mode == "counts":
        if counts is None or len(counts) != E or sum(counts) != M * k or max(counts) > M:
            raise ValueError(f"counts must have {E} entries summing to num_tokens*top_k={M * k}, "
                             f"each <= num_tokens")
        routes = torch.repeat_interleave(torch.arange(E), torch.tensor(list(counts)))
        # Route i goes to token i % M: an expert's routes are consecutive, so they land on
        # distinct tokens whenever its count is at most M.
        ids = routes.view(k, M).T.contiguous()
    else:
        raise ValueError(f"mode={mode!r} is not allowed: expected uniform, concentrated, "
                         "one_expert or counts")
    return _topk_weights(M, k, g).to(device), ids.to(torch.int32).to(device)


def random_tokens(spec: MoESpec, num_tokens: int, seed: int = 0, device="cpu") -> torch.Tensor:
    g = _gen(seed)
    x = torch.randn(num_tokens, spec.hidden_size, generator=g)
    return x.to(getattr(torch, spec.act_dtype)).to(device)


def random_masked_inputs(num_experts: int, hidden: int, max_m: int, masked_m: Sequence[int],
                         seed: int = 0, device="cpu", scale_layout: str = "column",
                         fp8_dtype=torch.float8_e4m3fn):
    """DeepEP low-latency activations: x fp8 [E, max_m, H], x_scale fp32 [E, max_m, H/128]
    (column-major in its last two dims as DeepEP emits it, or row-major), masked_m int32 [E].
    Rows beyond masked_m hold NaN scales, so a kernel that reads them shows it."""
    if scale_layout not in ("column", "row"):
        raise ValueError(f"scale_layout={scale_layout!r} is not allowed: expected 'column' or 'row'")
    # Made where they are used: host-made inputs of 512 experts x 2048 rows x 7168 take minutes.
    g = torch.Generator(device=device).manual_seed(seed)
    groups = hidden // TOKEN_GROUP
    limit = torch.finfo(fp8_dtype).max
    x = (torch.randn(num_experts, max_m, hidden, generator=g, device=device) * 100).clamp(-limit, limit)
    x = x.to(fp8_dtype)
    scale = torch.rand(num_experts, max_m, groups, generator=g, device=device) * 0.01 + 0.01
    rows = torch.arange(max_m, device=device).view(1, -1, 1)
    masked = torch.tensor(list(masked_m), dtype=torch.int32, device=device)
    scale = torch.where(rows < masked.view(-1, 1, 1), scale, torch.full_like(scale, float("nan")))
    if scale_layout == "column":
        scale = scale.transpose(1, 2).contiguous().transpose(1, 2)
    return x, scale, masked
