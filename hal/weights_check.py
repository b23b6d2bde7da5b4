"""Shape and dtype contract of `MoEWeights` for each weight format (docs/contract.md, "Weight formats")."""

from __future__ import annotations

import math

import torch

from hal.spec import FP8_BLOCK, INT4_PACK, MXFP4_GROUP, MoESpec


def expected_shapes(spec: MoESpec) -> dict:
    """name -> (shape, allowed dtypes) for every tensor the spec's format needs."""
    E, H, I, R = spec.local_experts, spec.hidden_size, spec.intermediate_size, spec.w13_rows
    act = getattr(torch, spec.act_dtype)
    fmt = spec.weight_format
    if fmt == "bf16":
        shapes = {"w13": ((E, R, H), (torch.bfloat16,)), "w2": ((E, H, I), (torch.bfloat16,))}
    elif fmt == "fp8_block128":
        c = lambda n: math.ceil(n / FP8_BLOCK)  # noqa: E731
        shapes = {
            "w13": ((E, R, H), (torch.float8_e4m3fn,)),
            "w2": ((E, H, I), (torch.float8_e4m3fn,)),
            "w13_scale": ((E, c(R), c(H)), (torch.float32,)),
            "w2_scale": ((E, c(H), c(I)), (torch.float32,)),
        }
    elif fmt == "mxfp4":
        shapes = {
            "w13": ((E, R, H // 2), (torch.uint8,)),
            "w2": ((E, H, I // 2), (torch.uint8,)),
            "w13_scale": ((E, R, H // MXFP4_GROUP), (torch.uint8,)),
            "w2_scale": ((E, H, I // MXFP4_GROUP), (torch.uint8,)),
        }
    else:  # int4_g128 and w4afp8 share GPTQ's uint4b8 container
        gh, gi = spec.scale_groups(H), spec.scale_groups(I)
        scale_dtype = torch.bfloat16 if fmt == "w4afp8" else act
        shapes = {
            "w13": ((E, H // INT4_PACK, R), (torch.int32,)),
            "w2": ((E, I // INT4_PACK, H), (torch.int32,)),
            "w13_scale": ((E, gh, R), (scale_dtype,)),
            "w2_scale": ((E, gi, H), (scale_dtype,)),
        }
        if fmt == "w4afp8":
            shapes["w13_input_scale"] = ((), (torch.float32,))
            shapes["w2_input_scale"] = ((), (torch.float32,))
    if spec.has_bias:
        shapes["b13"] = ((E, R), (torch.float32, torch.bfloat16, torch.float16))
        shapes["b2"] = ((E, H), (torch.float32, torch.bfloat16, torch.float16))
    return shapes


def check_weights(weights, spec: MoESpec) -> None:
    """Raise ValueError naming the first tensor whose shape, dtype or device is off."""
    shapes = expected_shapes(spec)
    device = None
    for name, (shape, dtypes) in shapes.items():
        t = getattr(weights, name)
        if t is None:
            raise ValueError(f"weights.{name} is missing: weight_format={spec.weight_format}"
                             f"{' with bias' if name.startswith('b') else ''} needs it")
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"weights.{name} has shape {tuple(t.shape)}: expected {tuple(shape)} "
                             f"for {spec.weight_format}")
        if t.dtype not in dtypes:
            raise ValueError(f"weights.{name} has dtype {t.dtype}: expected "
                             + " or ".join(str(d) for d in dtypes))
        if device is None:
            device = t.device
        elif t.device != device:
            raise ValueError(f"weights.{name} is on {t.device}: expected {device} like weights.w13")
    for name in ("b13", "b2"):
        if getattr(weights, name) is not None and not spec.has_bias:
            raise ValueError(f"weights.{name} is set but spec.has_bias is False")
    check_expert_map(weights.expert_map, spec, device)


def check_expert_map(expert_map, spec: MoESpec, device=None) -> None:
    """`device`, when given, is the weights' device: the map is read there, so it lives there."""
    if expert_map is None:
        if spec.is_ep:
            raise ValueError("weights.expert_map is missing: spec.num_local_experts="
                             f"{spec.num_local_experts} < num_experts={spec.num_experts} needs it")
        return
    if device is not None and expert_map.device != device:
        raise ValueError(f"weights.expert_map is on {expert_map.device}: expected {device} like "
                         "weights.w13")
    if expert_map.dtype != torch.int32 or tuple(expert_map.shape) != (spec.num_experts,):
        raise ValueError(f"weights.expert_map is {expert_map.dtype} {tuple(expert_map.shape)}: "
                         f"expected torch.int32 ({spec.num_experts},)")
    lo, hi = int(expert_map.min()), int(expert_map.max())
    if lo < -1 or hi >= spec.local_experts:
        raise ValueError(f"weights.expert_map holds values in [{lo}, {hi}]: expected -1 "
                         f"(not local) or a local id in [0, {spec.local_experts})")
    # Two global experts on one local id would silently share its weights.
    local = expert_map[expert_map >= 0]
    ids, counts = torch.unique(local, return_counts=True)
    if bool((counts > 1).any()):
        dup = int(ids[counts > 1][0])
        owners = torch.nonzero(expert_map == dup).flatten().tolist()
        raise ValueError(f"weights.expert_map maps global experts {owners} to the same local id "
                         f"{dup}: expected each local id at most once")
