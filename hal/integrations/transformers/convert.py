"""A transformers experts module in moe-hal's terms: the MoESpec of the layer and its weights as
hal.MoEWeights (docs/contract.md, "Weight formats").

transformers stores experts in several layouts, described by the flags `use_experts_implementation`
sets on the module: `is_transposed` ([E, in, out] instead of [E, out, in]), `is_concatenated`
(gate/up as [gate; up] or interleaved), `has_bias`, `has_gate`. FP8Experts (fine-grained FP8
checkpoints) hold float8_e4m3fn weights with `*_scale_inv` per 128x128 block, which is moe-hal's
fp8_block128 as it is. The conversion here is the only place that knows those layouts."""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from hal.integrations.transformers.activation import Activation, detect
from hal.integrations.transformers.unsupported import Unsupported
from hal.spec import FP8_BLOCK, MoESpec, MoEWeights

ACT_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
# moe-hal's row order for gate/up per activation (docs/contract.md, "What every backend computes").
HAL_ORDER = {"silu": "concatenated", "swiglu_oai": "interleaved", "relu2": "single"}


@attrs.frozen
class Layout:
    """How one module's experts map onto a spec: the spec, the activation found on the module, and
    whether its tensors are [E, in, out] (transposed)."""

    spec: MoESpec
    activation: Activation
    transposed: bool


def local(t: torch.Tensor) -> torch.Tensor:
    """Under transformers' expert parallelism the parameters are DTensors: this rank's shard."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _tensor(module, name: str) -> Optional[torch.Tensor]:
    t = getattr(module, name, None)
    return local(t) if isinstance(t, torch.Tensor) else None


def source_tensors(module) -> dict:
    """Every tensor of the module that the prepared weights are made from, by role."""
    up = "gate_up_proj" if getattr(module, "has_gate", True) else "up_proj"
    tensors = {"w13": _tensor(module, up), "w2": _tensor(module, "down_proj"),
               "w13_scale": _tensor(module, f"{up}_scale_inv"),
               "w2_scale": _tensor(module, "down_proj_scale_inv"), "b13": None, "b2": None}
    if getattr(module, "has_bias", False):
        tensors["b13"] = _tensor(module, f"{up}_bias")
        tensors["b2"] = _tensor(module, "down_proj_bias")
    return tensors


def _weight_format(module, w13: torch.Tensor) -> str:
    if w13.dtype == torch.bfloat16:
        return "bf16"
    if w13.dtype == torch.float8_e4m3fn:
        block = getattr(module, "block_size", None)
        if block is None or tuple(block) != (FP8_BLOCK, FP8_BLOCK):
            raise Unsupported(f"FP8 weights with block_size={block}: moe-hal's fp8_block128 takes one "
                              f"scale per {FP8_BLOCK}x{FP8_BLOCK} block")
        if getattr(module, "gate_up_proj_scale_inv", getattr(module, "up_proj_scale_inv", None)) is None \
                or getattr(module, "down_proj_scale_inv", None) is None:
            raise Unsupported("FP8 weights without their *_scale_inv block scales")
        scheme = getattr(module, "activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise Unsupported(f"activation_scheme={scheme!r}: the checkpoint quantizes activations with "
                              "static scales, which moe-hal's fp8_block128 does not apply")
        return "fp8_block128"
    raise Unsupported(f"{w13.dtype} expert weights are not served: moe-hal reads bfloat16 (bf16) or "
                      "float8_e4m3fn with 128x128 block scales (fp8_block128) expert weights; load the model "
                      "with dtype=torch.bfloat16")


def describe(module, act_dtype: torch.dtype, top_k: int) -> Layout:
    """The layer as a MoESpec, or Unsupported naming what moe-hal cannot serve."""
    if getattr(module, "has_post_expert_norm", False):
        raise Unsupported("the experts apply a norm after each expert (has_post_expert_norm), which the "
                          "MoE op does not include")
    tensors = source_tensors(module)
    w13, w2 = tensors["w13"], tensors["w2"]
    if w13 is None or w2 is None or w13.dim() != 3 or w2.dim() != 3:
        raise Unsupported(f"{type(module).__name__} does not hold 3-D gate_up_proj/up_proj and down_proj "
                          "tensors")
    fmt = _weight_format(module, w13)
    if act_dtype not in ACT_DTYPES:
        raise Unsupported(f"activations are {act_dtype}: moe-hal takes bfloat16 or float16 activations "
                          f"(with {fmt} weights)")
    if w2.dtype != w13.dtype:
        raise Unsupported(f"down_proj is {w2.dtype} but the first projection is {w13.dtype}")
    transposed = bool(getattr(module, "is_transposed", False))
    if transposed and fmt != "bf16":
        raise Unsupported(f"transposed {fmt} experts: block scales are stored for [out, in] weights")
    E = w13.shape[0]
    rows, hidden = (w13.shape[2], w13.shape[1]) if transposed else (w13.shape[1], w13.shape[2])
    gated = getattr(module, "has_gate", True)
    intermediate = rows // 2 if gated else rows
    activation = detect(module, intermediate, w13.device)
    if fmt == "fp8_block128" and activation.order != HAL_ORDER[activation.name]:
        raise Unsupported(f"{activation.name} on {activation.order} gate/up rows in fp8_block128: moe-hal "
                          f"wants {HAL_ORDER[activation.name]} rows, and reordering rows would split the "
                          f"{FP8_BLOCK}-row scale blocks")
    has_bias = tensors["b13"] is not None
    if getattr(module, "has_bias", False) and (tensors["b13"] is None or tensors["b2"] is None):
        raise Unsupported("has_bias is set but the module lacks gate_up_proj_bias or down_proj_bias")
    extra = {}
    if activation.name == "swiglu_oai":
        extra = {"swiglu_alpha": activation.alpha, "swiglu_limit": activation.limit}
    try:
        spec = MoESpec(num_experts=E, top_k=top_k, hidden_size=hidden, intermediate_size=intermediate,
                       weight_format=fmt, activation=activation.name, has_bias=has_bias,
                       act_dtype=ACT_DTYPES[act_dtype], **extra)
    except ValueError as exc:
        raise Unsupported(f"the layer is no valid MoESpec: {exc}") from exc
    return Layout(spec, activation, transposed)


def _row_order(activation: Activation, rows: int) -> Optional[torch.Tensor]:
    """Index that reorders the module's gate/up rows into moe-hal's order, or None if they agree."""
    want = HAL_ORDER[activation.name]
    if activation.order == want:
        return None
    half = rows // 2
    if want == "interleaved":  # [gate; up] -> gate0, up0, gate1, up1, ...
        return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)
    return torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)])  # interleaved -> [gate; up]


def to_weights(module, layout: Layout) -> MoEWeights:
    """The module's tensors in moe-hal's layout: [E, out, in], moe-hal's gate/up order, fp32 scales.
    Copies only where the layout differs; the kernel's prepare_weights repacks them anyway."""
    t = source_tensors(module)
    w13, w2, b13 = t["w13"], t["w2"], t["b13"]
    if layout.transposed:
        w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
    order = _row_order(layout.activation, layout.spec.w13_rows)
    if order is not None:
        order = order.to(w13.device)
        w13 = w13.index_select(1, order)
        b13 = None if b13 is None else b13.index_select(1, order)
    scales = {}
    if layout.spec.weight_format == "fp8_block128":
        # UE8M0 scales (float8_e8m0fnu) convert to float32 exactly.
        scales = {name: t[name].float().contiguous() for name in ("w13_scale", "w2_scale")}
    return MoEWeights(w13=w13.contiguous(), w2=w2.contiguous(), b13=None if b13 is None else b13.contiguous(),
                      b2=None if t["b2"] is None else t["b2"].contiguous(), **scales)
