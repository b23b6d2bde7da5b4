"""Kernel objects that `select_moe_kernel` returns. A backend subclasses one of them and fills in
`_prepare`, `_run` and `plan`; the base does validation, output allocation and bookkeeping."""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from hal.backend import Target
from hal.inputs import check_masked_inputs, check_token_inputs
from hal.spec import MoESpec, MoEWeights


@attrs.frozen
class Prepared:
    """Weights repacked by one kernel for one spec. Opaque to callers."""

    backend: str
    spec: object
    data: object

    def check_for(self, kernel) -> None:
        if self.backend != kernel.backend or self.spec != kernel.spec:
            raise ValueError(f"prepared was made by backend {self.backend!r} for {self.spec}; this "
                             f"kernel is {kernel.backend!r} for {kernel.spec}: call this kernel's "
                             "prepare_weights")


class KernelBase:
    backend: str = "?"
    variant: str = "default"  # a baseline variant (hal bench) overrides this

    def __init__(self, spec, target: Target):
        self.spec = spec
        self.target = target
        self.device = torch.device(target.device)
        self.decision = None  # set by the registry

    def _validated(self, weights) -> MoEWeights:
        if not isinstance(weights, MoEWeights):
            raise ValueError(f"weights must be hal.MoEWeights, got {type(weights).__name__}")
        return weights.validate(self.spec)

    def _check_prepared(self, prepared) -> None:
        if not isinstance(prepared, Prepared):
            raise ValueError("prepared must come from this kernel's prepare_weights")
        prepared.check_for(self)

    def compile(self) -> list:
        """Build every JIT specialization this kernel needs now; return their descriptions.
        Kernels with nothing to compile return []."""
        return []

    def baselines(self) -> dict:
        """Named variants to time against in `hal bench` (the seed's old policy, say)."""
        return {}

    def __repr__(self):
        return f"<{type(self).__name__} backend={self.backend} variant={self.variant} {self.spec}>"


class MoEKernel(KernelBase):
    """Token layout: kernel(x [M, H], topk_weights [M, k], topk_ids [M, k], prepared) -> [M, H]."""

    def prepare_weights(self, weights: MoEWeights) -> Prepared:
        self._validated(weights)
        if weights.w13.device != self.device:
            raise ValueError(f"weights are on {weights.w13.device}: expected {self.device}")
        return Prepared(self.backend, self.spec, self._prepare(weights))

    def __call__(self, x, topk_weights, topk_ids, prepared: Prepared, out: Optional[torch.Tensor] = None,
                 *, check: bool = True):
        if check:
            self._check_prepared(prepared)
            check_token_inputs(self.spec, self.device, x, topk_weights, topk_ids, out)
        if out is None:
            out = torch.empty_like(x)
        if x.shape[0]:
            self._run(x, topk_weights, topk_ids, prepared.data, out)
        return out

    def _prepare(self, weights: MoEWeights):
        raise NotImplementedError

    def _run(self, x, topk_weights, topk_ids, data, out) -> None:
        raise NotImplementedError

    def plan(self, topk_ids):
        raise NotImplementedError


class MaskedMoEKernel(KernelBase):
    """DeepEP masked layout: kernel(x fp8 [E, max_m, H], x_scale, masked_m, prepared) -> bf16
    [E, max_m, H]. Rows at or beyond masked_m[e] are never read or written."""

    def prepare_weights(self, weights: MoEWeights) -> Prepared:
        self._validated(weights)
        return Prepared(self.backend, self.spec, self._prepare(weights))

    def __call__(self, x, x_scale, masked_m, prepared: Prepared, expected_rows: Optional[int] = None,
                 out: Optional[torch.Tensor] = None, *, check: bool = True):
        spec: MoESpec = self.spec
        if check:
            self._check_prepared(prepared)
            check_masked_inputs(spec.local_experts, spec.hidden_size, self.device, x, x_scale,
                                masked_m, expected_rows)
            if out is not None and (not isinstance(out, torch.Tensor) or out.shape != x.shape
                                    or out.dtype != torch.bfloat16 or out.device != x.device
                                    or not out.is_contiguous()):
                raise ValueError(f"out must be a contiguous bfloat16 tensor of shape "
                                 f"{tuple(x.shape)} on {x.device}")
        if out is None:
            out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
        self._run(x, x_scale, masked_m, prepared.data, out, expected_rows)
        return out

    def _prepare(self, weights: MoEWeights):
        raise NotImplementedError

    def _run(self, x, x_scale, masked_m, data, out, expected_rows) -> None:
        raise NotImplementedError

    def plan(self, masked_m=None, expected_rows: Optional[int] = None, max_m: Optional[int] = None):
        raise NotImplementedError


class RequantKernel(KernelBase):
    """kernel(x, x_scale, masked_m, output_scale, out=None, expected_rows=None) -> per-tensor FP8."""

    @property
    def fp8_dtype(self) -> torch.dtype:
        """The FP8 encoding of the target: e4m3fnuz on gfx942, OCP e4m3fn elsewhere."""
        gpu = self.target.gpu
        if gpu is not None and gpu.features.fp8 == "fnuz":
            return torch.float8_e4m3fnuz
        return torch.float8_e4m3fn

    def __call__(self, x, x_scale, masked_m, output_scale, out=None, expected_rows=None, *,
                 check: bool = True):
        raise NotImplementedError

    def plan(self, max_m: int, expected_rows: Optional[int] = None):
        raise NotImplementedError
