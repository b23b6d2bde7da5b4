"""The requant backend's kernels: the Triton requant behind the RequantKernel API, and the W4AFP8
masked MoE whose requant runs on Triton and whose GEMM stages run on hal.backends.reference."""

from __future__ import annotations

from typing import Optional

import torch
from hal.backends.reference import dequant, ops
from hal.backends.requant.device import device_traits
from hal.backends.requant.op import GEOMETRIES, fp8_per_token_to_per_tensor
from hal.backends.requant.plan import MaskedMoEPlan, requant_plan

from hal import traceable
from hal.kernel import MaskedMoEKernel, RequantKernel

NAME = "requant"


class RequantTritonKernel(RequantKernel):
    backend = NAME

    def __init__(self, spec, target, variant: str = "tuned"):
        super().__init__(spec, target)
        if variant not in GEOMETRIES:
            raise ValueError(f"variant={variant!r} is not allowed: expected one of {GEOMETRIES}")
        self.variant = variant
        self.traits = device_traits(self.device, self.target.gpu)

    def baselines(self) -> dict:
        if self.variant != "tuned":
            return {}
        return {"legacy": RequantTritonKernel(self.spec, self.target, "legacy")}

    @traceable.between_graphs
    def _run(self, x, x_scale, masked_m, output_scale, out, expected_rows) -> None:
        fp8_per_token_to_per_tensor(x, x_scale, masked_m, output_scale, out, expected_rows,
                                    geometry=self.variant, gpu=self.target.gpu, check=False)

    def plan(self, max_m: int, expected_rows: Optional[int] = None):
        return requant_plan(self.variant, self.spec.hidden_size, self.spec.num_experts, max_m,
                            expected_rows, self.traits)


class W4AFp8MaskedKernel(MaskedMoEKernel):
    """DeepEP low-latency W4AFP8 MoE: the per-token-group activations are requantized to per-tensor
    FP8 with GEMM 1's static input scale on Triton; the rest runs on hal.backends.reference."""

    backend = NAME

    def __init__(self, spec, target):
        super().__init__(spec, target)
        self.traits = device_traits(self.device, self.target.gpu)

    def _prepare(self, weights):
        scale = weights.w13_input_scale.to(device=self.device, dtype=torch.float32).reshape(1)
        value = float(scale)
        if not 0 < value < float("inf"):
            raise ValueError(f"weights.w13_input_scale={value}: expected a finite value > 0")
        # fp32 GEMMs, as the reference's: a 16-bit GEMM 1 would move its output across FP8 roundings
        # when it is requantized, beyond the contract.
        w13 = dequant.w13(self.spec, weights, torch.float32)
        w2 = dequant.w2(self.spec, weights, torch.float32)
        return dict(weights=ops.beside_experts(weights), w13=w13, w2=w2, input_scale=scale)

    @traceable.between_graphs
    def _run(self, x, x_scale, masked_m, data, out, expected_rows):
        per_tensor = fp8_per_token_to_per_tensor(x, x_scale, masked_m, data["input_scale"],
                                                 expected_rows=expected_rows, gpu=self.target.gpu,
                                                 check=False)
        ops.moe_masked_per_tensor(self.spec, per_tensor, masked_m, data["weights"], out,
                                  compute_dtype=torch.float32,
                                  experts=lambda e: (data["w13"][e], data["w2"][e], None, None))

    def plan(self, masked_m, expected_rows: Optional[int] = None, max_m: Optional[int] = None):
        if max_m is None:
            max_m = int(masked_m.max()) if masked_m.numel() else 0
        requant = requant_plan("tuned", self.spec.hidden_size, self.spec.local_experts, max_m,
                               expected_rows, self.traits)
        return MaskedMoEPlan(requant, int((masked_m > 0).sum()), int(masked_m.sum()))


BY_OP = {"requant": RequantTritonKernel, "moe_masked": W4AFp8MaskedKernel}
