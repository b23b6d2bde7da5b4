"""The executable contract: every op that moe-hal serves, written plainly in torch. Tests compare
every kernel with these functions; the reference backend runs them as the last fallback; a backend
may call one for a stage it does not accelerate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import attrs
import torch
from hal.backends.reference import activation, dequant

from hal.spec import TOKEN_GROUP, MoESpec

# expert id -> (W13 [rows, H], W2 [H, I], b13 [rows] | None, b2 [H] | None) in the compute dtype
ExpertWeights = Callable[[int], tuple]


def checkpoint_experts(spec: MoESpec, weights, dtype) -> ExpertWeights:
    """Dequantize one expert at a time from the checkpoint format, so a float64 evaluation of a
    256-expert layer never holds more than one expert in float64."""

    def get(e: int):
        b13 = None if weights.b13 is None else weights.b13[e].to(dtype)
        b2 = None if weights.b2 is None else weights.b2[e].to(dtype)
        return (dequant.w13(spec, weights, dtype, expert=e), dequant.w2(spec, weights, dtype, expert=e),
                b13, b2)

    return get


FP8_ACT_GROUP = 128
FP8_MIN_AMAX = 1e-12  # an all-zero slice quantizes to zeros instead of dividing by zero


def fp8_groups(values: torch.Tensor) -> torch.Tensor:
    """act_quant="fp8_g128": values [rows, cols] quantized to e4m3 per row and 128 columns and
    back, in values' dtype. The quantization is fp32 arithmetic, as specified: s = max(max|v|,
    1e-12) / 448 over each 1 x 128 slice, q = e4m3(clamp(v / s, +-448)) rounded to nearest even."""
    rows, cols = values.shape
    padded = torch.nn.functional.pad(values.float(), (0, (-cols) % FP8_ACT_GROUP))
    groups = padded.view(rows, -1, FP8_ACT_GROUP)
    limit = fp8_max(torch.float8_e4m3fn)
    scale = groups.abs().amax(-1, keepdim=True).clamp_min(FP8_MIN_AMAX) / limit
    q = (groups / scale).clamp(-limit, limit).to(torch.float8_e4m3fn)
    return (q.to(values.dtype) * scale.to(values.dtype)).view(rows, -1)[:, :cols]


def beside_experts(weights):
    """What these ops read from the weights when the caller passes `experts`: expert_map and the
    input scales, without the experts' tensors (a kernel keeps these, not a second checkpoint)."""
    return attrs.evolve(weights, w13=None, w2=None, w13_scale=None, w2_scale=None, b13=None, b2=None)


def ffn(spec: MoESpec, x: torch.Tensor, expert: tuple) -> torch.Tensor:
    w13, w2, b13, b2 = expert
    quantized = spec.act_quant == "fp8_g128"
    h = (fp8_groups(x) if quantized else x) @ w13.T
    if b13 is not None:
        h = h + b13
    # The activation runs in at least fp32, as the fused kernels do between their GEMMs.
    act_dtype = torch.promote_types(h.dtype, torch.float32)
    a = activation.apply(spec, h.to(act_dtype))
    if quantized:  # GEMM 2 reads the activation as the layer stores it, in act_dtype, then quantized
        a = fp8_groups(a.to(getattr(torch, spec.act_dtype)).to(act_dtype))
    y = a.to(w2.dtype) @ w2.T
    if b2 is not None:
        y = y + b2
    return y


def local_ids(spec: MoESpec, topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor]) -> torch.Tensor:
    """Global routed ids -> local expert ids, -1 for a route that adds nothing: an id of -1 (a
    dropped route), an id outside [0, num_experts), an expert on another rank, or an expert_map
    value outside [0, local_experts). An id outside [-1, num_experts) and a map value outside
    [-1, local_experts) are invalid input that check=True rejects; with check=False every kernel
    routes them the same way, so they never index the weights."""
    ids = topk_ids.long()
    valid = (ids >= 0) & (ids < spec.num_experts)
    local = torch.where(valid, ids, -1)
    if expert_map is not None:
        # Clamped so a bad id indexes the map in bounds; its route is dropped by `valid`.
        mapped = expert_map.long()[ids.clamp(0, expert_map.numel() - 1)]
        local = torch.where(valid, mapped, -1)
    return torch.where((local >= 0) & (local < spec.local_experts), local, -1)


def moe_tokens(spec: MoESpec, x, topk_weights, topk_ids, weights, compute_dtype=torch.float32,
               experts: Optional[ExpertWeights] = None) -> torch.Tensor:
    """out[m] = sum_j topk_weights[m, j] * FFN_{topk_ids[m, j]}(x[m]), in x's dtype.

    compute_dtype float64 gives the oracle of the tests; `experts` lets a caller that has already
    dequantized (the reference kernel) skip the per-expert dequantization."""
    experts = experts or checkpoint_experts(spec, weights, compute_dtype)
    ids = local_ids(spec, topk_ids, weights.expert_map)
    xf = x.to(compute_dtype)
    out = torch.zeros(x.shape, dtype=torch.float64 if compute_dtype == torch.float64 else torch.float32,
                      device=x.device)
    for e in torch.unique(ids[ids >= 0]).tolist():
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        y = ffn(spec, xf[rows], experts(e)).to(out.dtype)
        out.index_add_(0, rows, y * topk_weights[rows, slots].to(out.dtype).unsqueeze(1))
    return out.to(x.dtype)


def live_rows(masked_m: torch.Tensor, max_m: int) -> list:
    """Rows of each expert that the masked layout reads and writes: masked_m[e] clamped to
    [0, max_m]. check=True rejects values outside that range; with check=False every kernel clamps
    them the same way, so no row outside [0, max_m) is touched."""
    return masked_m.clamp(0, max_m).tolist()


def fp8_max(dtype) -> float:
    return float(torch.finfo(dtype).max)


def group_scales(x_scale: torch.Tensor, rows: int, hidden: int) -> torch.Tensor:
    """[rows, H/128] per-token-group scales -> [rows, H], whatever their memory order."""
    return x_scale[:rows].repeat_interleave(TOKEN_GROUP, dim=-1)[:, :hidden]


def quantize_fp8(values: torch.Tensor, inv_scale: torch.Tensor, dtype) -> torch.Tensor:
    """fp8(clamp(values * inv_scale)): the clamp first, because torch's cast does not saturate."""
    limit = fp8_max(dtype)
    return (values * inv_scale).clamp(-limit, limit).to(dtype)


def requant_fp8(x, x_scale, masked_m, output_scale, out) -> torch.Tensor:
    """Per-token-group FP8 [E, max_m, H] -> per-tensor FP8, bit-exact contract:
    out = fp8(clamp((float(x) * s_group) * (1 / s_out), +-max)), all fp32, left to right, the
    reciprocal one IEEE division. Rows at or beyond masked_m[e] are neither read nor written."""
    inv = 1.0 / output_scale.to(torch.float32).reshape(())
    for e, m in enumerate(live_rows(masked_m, x.shape[1])):
        if m:
            v = x[e, :m].to(torch.float32) * group_scales(x_scale[e], m, x.shape[-1])
            out[e, :m] = quantize_fp8(v, inv, out.dtype)
    return out


def moe_masked_per_tensor(spec: MoESpec, xq, masked_m, weights, out, compute_dtype=torch.float32,
                          experts: Optional[ExpertWeights] = None) -> torch.Tensor:
    """The GEMM stages of W4AFP8 on the masked layout, from activations already requantized to
    per-tensor FP8 with weights.w13_input_scale: GEMM 1, the activation, its requant with
    weights.w2_input_scale (as a W4A8 GEMM consumes it), GEMM 2. Rows beyond masked_m stay
    untouched."""
    experts = experts or checkpoint_experts(spec, weights, compute_dtype)
    a13 = weights.w13_input_scale.to(torch.float32).reshape(())
    a2 = weights.w2_input_scale.to(torch.float32).reshape(())
    for e, m in enumerate(live_rows(masked_m, xq.shape[1])):
        if not m:
            continue
        a = xq[e, :m].to(compute_dtype) * a13.to(compute_dtype)
        w13, w2, _, _ = experts(e)
        h = activation.apply(spec, a @ w13.T).to(torch.float32)
        h = quantize_fp8(h, 1.0 / a2, xq.dtype).to(compute_dtype) * a2.to(compute_dtype)
        out[e, :m] = (h @ w2.T).to(out.dtype)
    return out


def moe_masked(spec: MoESpec, x, x_scale, masked_m, weights, out, compute_dtype=torch.float32,
               experts: Optional[ExpertWeights] = None) -> torch.Tensor:
    """W4AFP8 on the DeepEP masked layout: requant every live row to per-tensor FP8 with the static
    input scale of GEMM 1, then the GEMM stages."""
    xq = torch.empty_like(x)
    requant_fp8(x, x_scale, masked_m, weights.w13_input_scale, xq)
    return moe_masked_per_tensor(spec, xq, masked_m, weights, out, compute_dtype, experts)
