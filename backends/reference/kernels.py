"""The reference backend's kernels: the ops of hal.backends.reference.ops behind the kernel API."""

from __future__ import annotations

from typing import Optional

import attrs
import torch
from hal.backends.reference import dequant, ops

from hal.kernel import MaskedMoEKernel, MoEKernel, RequantKernel

NAME = "reference"


@attrs.frozen
class ReferencePlan:
    experts_used: int
    routes: int
    compute: str

    def describe(self) -> str:
        return (f"reference: {self.routes} routes over {self.experts_used} routed experts, one "
                f"torch matmul pair per local expert ({self.compute})")


def compute_dtype(spec) -> torch.dtype:
    """The activation dtype, as an engine without this library computes; fp32 where the spec
    quantizes activations, since e4m3 rounding amplifies a 16-bit GEMM's own (one step on about
    3% of the values)."""
    quantized = spec.act_quant != "none" or spec.layout == "masked"  # masked: e4m3 in and between
    return torch.float32 if quantized else getattr(torch, spec.act_dtype)


def _dequantized_experts(kernel, weights):
    """Dequantize every expert to the compute dtype once and hand them to ops as a lookup."""
    dtype = compute_dtype(kernel.spec)
    w13 = dequant.w13(kernel.spec, weights, torch.float32).to(dtype)
    w2 = dequant.w2(kernel.spec, weights, torch.float32).to(dtype)
    b13 = None if weights.b13 is None else weights.b13.to(torch.float32)
    b2 = None if weights.b2 is None else weights.b2.to(torch.float32)
    return dict(w13=w13, w2=w2, b13=b13, b2=b2, weights=ops.beside_experts(weights))


def _lookup(data):
    def get(e):
        return (data["w13"][e], data["w2"][e],
                None if data["b13"] is None else data["b13"][e].to(data["w13"].dtype),
                None if data["b2"] is None else data["b2"][e].to(data["w13"].dtype))
    return get


class ReferenceMoEKernel(MoEKernel):
    backend = NAME
    differentiable = True  # torch ops throughout: gradients reach x and topk_weights

    def _prepare(self, weights):
        return _dequantized_experts(self, weights)

    def _run(self, x, topk_weights, topk_ids, data, out):
        out.copy_(ops.moe_tokens(self.spec, x, topk_weights, topk_ids, data["weights"],
                                 compute_dtype=compute_dtype(self.spec), experts=_lookup(data)))

    def plan(self, topk_ids):
        ids = topk_ids.long()
        ids = ids[(ids >= 0) & (ids < self.spec.num_experts)]  # -1 and bad ids are no route
        return ReferencePlan(experts_used=int(torch.unique(ids).numel()), routes=int(ids.numel()),
                             compute=f"{self.spec.act_dtype} matmuls, fp32 accumulation of routes")


class ReferenceMaskedKernel(MaskedMoEKernel):
    backend = NAME

    def _prepare(self, weights):
        return _dequantized_experts(self, weights)

    def _run(self, x, x_scale, masked_m, data, out, expected_rows):
        ops.moe_masked(self.spec, x, x_scale, masked_m, data["weights"], out,
                       compute_dtype=compute_dtype(self.spec), experts=_lookup(data))

    def plan(self, masked_m, expected_rows: Optional[int] = None, max_m: Optional[int] = None):
        return ReferencePlan(experts_used=int((masked_m > 0).sum()), routes=int(masked_m.sum()),
                             compute="torch requant + fp32 matmuls per live expert")


@attrs.frozen
class RequantReferencePlan:
    fp8_dtype: str

    def describe(self) -> str:
        return f"reference: torch loop over experts, output {self.fp8_dtype}"


class ReferenceRequantKernel(RequantKernel):
    backend = NAME

    def _run(self, x, x_scale, masked_m, output_scale, out, expected_rows) -> None:
        ops.requant_fp8(x, x_scale, masked_m, output_scale, out)

    def plan(self, max_m: int, expected_rows: Optional[int] = None):
        return RequantReferencePlan(str(self.fp8_dtype).replace("torch.", ""))


BY_OP = {"moe": ReferenceMoEKernel, "moe_masked": ReferenceMaskedKernel, "requant": ReferenceRequantKernel}
