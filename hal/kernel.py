"""The kernel templates, one per op (hal.ops): what `select_*_kernel` returns. Each template
validates the call's arguments (skipped with check=False), allocates the output, returns at once
when there is nothing to compute, and only then calls the backend's hook. A backend subclasses
the template of each op it serves and fills in its hooks:

    op          template          hooks
    moe         MoEKernel         _prepare(weights), _run(x, topk_weights, topk_ids, data, out),
                                  plan(topk_ids)
    moe_masked  MaskedMoEKernel   _prepare(weights), _run(x, x_scale, masked_m, data, out,
                                  expected_rows), plan(masked_m, expected_rows=None, max_m=None)
    requant     RequantKernel     _run(x, x_scale, masked_m, output_scale, out, expected_rows),
                                  plan(max_m, expected_rows=None)

Every plan() returns an object with describe() -> str (the `Plan` protocol): the per-call
decision in words, as `hal select` prints it."""

from __future__ import annotations

import functools
import inspect
from typing import Optional, Protocol, runtime_checkable

import attrs
import torch

from hal.backend import Target
from hal.inputs import (
    check_count,
    check_masked_inputs,
    check_masked_plan_args,
    check_requant_args,
    check_token_inputs,
    require,
)
from hal.live import refine
from hal.owned import owned
from hal.spec import MoESpec, MoEWeights


@runtime_checkable
class Plan(Protocol):
    """What kernel.plan(...) returns, for every op and backend."""

    def describe(self) -> str: ...


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


def _checked_plan(plan, check):
    """A backend's plan() that first has `check(kernel, arguments, signature)` validate what it was
    given: the template checks plan() arguments as it checks call arguments."""
    signature = inspect.signature(plan)

    @functools.wraps(plan)
    def checked(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        check(self, bound.arguments, signature)
        return plan(self, *args, **kwargs)

    return checked


def _masked_plan_args(kernel, arguments, signature) -> None:
    check_masked_plan_args(kernel.spec.local_experts, arguments.get("masked_m"),
                           arguments.get("expected_rows"), arguments.get("max_m"),
                           signature.parameters["masked_m"].default is None)


def _requant_plan_args(kernel, arguments, signature) -> None:
    check_count("max_m", arguments.get("max_m"), optional=False)
    check_count("expected_rows", arguments.get("expected_rows"))


class KernelBase:
    backend: str = "?"
    variant: str = "default"  # a baseline variant (hal bench) overrides this
    op: str = "?"  # the hal.ops name the template serves
    differentiable: bool = False  # whether a call records autograd on its inputs

    def __init__(self, spec, target: Target):
        self.spec = spec
        self.target = refine(target)  # built directly or by the registry: the same live facts
        self.device = torch.device(target.device)
        self.decision = None  # set by the registry

    @property
    def fp8_dtype(self) -> torch.dtype:
        """The FP8 encoding of the target: e4m3fnuz where its capabilities say fnuz (gfx942),
        OCP e4m3fn elsewhere."""
        gpu = self.target.gpu
        if gpu is not None and gpu.features.fp8 == "fnuz":
            return torch.float8_e4m3fnuz
        return torch.float8_e4m3fn

    def _check_autograd(self, out, **inputs) -> None:
        """With grad mode on, a tensor that requires grad is refused rather than silently cut off
        from its graph: out= always (it is written in place), inputs unless the kernel records
        autograd (only the reference backend's token kernel does)."""
        if not torch.is_grad_enabled():
            return
        if isinstance(out, torch.Tensor) and out.requires_grad:
            raise ValueError("out requires grad: the kernel writes it in place, which autograd does "
                             "not record; pass out=None or a tensor that does not require grad")
        if self.differentiable:
            return
        # Only the token layout has a backend that records autograd to point at.
        differentiable = (" or select backend 'reference' (prefer=\"reference\"), which propagates "
                          "gradients") if self.op == "moe" else ""
        for name, value in inputs.items():
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise ValueError(
                    f"{name} requires grad: the {self.backend} {self.op} kernels are inference-only "
                    "and would drop its gradient; call under torch.no_grad() or "
                    f"torch.inference_mode(), pass {name}.detach(){differentiable}")

    def _check_prepared(self, prepared) -> None:
        """Every kernel that takes weights (the MoE templates, the expert-parallel kernel) accepts
        only what its own prepare_weights returned."""
        if not isinstance(prepared, Prepared):
            raise ValueError("prepared must come from this kernel's prepare_weights")
        prepared.check_for(self)

    def compile(self) -> list:
        """Build every JIT specialization this kernel needs now; return their descriptions.
        Kernels with nothing to compile return []."""
        return []

    def baselines(self) -> dict:
        """Named variants to time against in `hal bench` (an upstream launch policy, say)."""
        return {}

    def plan_inputs(self, tokens: int, routing: str = "uniform") -> dict:
        """The plan() arguments of a synthetic batch of `tokens` tokens under `routing` (a
        hal.synth routing name): what `hal select --tokens N` plans for."""
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} backend={self.backend} variant={self.variant} {self.spec}>"


class _WeightsKernel(KernelBase):
    """The MoE templates: weights are checked against the spec and repacked once."""

    def prepare_weights(self, weights: MoEWeights) -> Prepared:
        """The weights repacked for this kernel. The result owns its memory: the caller may reuse
        or overwrite every tensor of `weights` afterwards (hal.owned)."""
        if not isinstance(weights, MoEWeights):
            raise ValueError(f"weights must be hal.MoEWeights, got {type(weights).__name__}")
        sources = [getattr(weights, field.name) for field in attrs.fields(MoEWeights)]
        if isinstance(weights.expert_map, torch.Tensor):
            # Checked as kept: a caller's later edit cannot slip a duplicate id past validation.
            weights = attrs.evolve(weights, expert_map=weights.expert_map.clone())
        weights.validate(self.spec)
        if weights.w13.device != self.device:
            raise ValueError(f"weights are on {weights.w13.device}: expected {self.device}")
        return Prepared(self.backend, self.spec, owned(self._prepare(weights), sources))

    def _prepare(self, weights: MoEWeights):
        raise NotImplementedError


class MoEKernel(_WeightsKernel):
    """Op "moe", the token layout: kernel(x [M, H], topk_weights [M, k], topk_ids [M, k], prepared)
    -> [M, H]. A topk id of -1 adds nothing."""

    op = "moe"

    def __call__(self, x, topk_weights, topk_ids, prepared: Prepared, out: Optional[torch.Tensor] = None,
                 *, check: bool = True):
        self._check_autograd(out, x=x, topk_weights=topk_weights)
        if check:
            self._check_prepared(prepared)
            check_token_inputs(self.spec, self.device, x, topk_weights, topk_ids, out)
        if out is None:
            out = torch.empty_like(x)
        if x.shape[0]:
            self._run(x, topk_weights, topk_ids, prepared.data, out)
        return out

    def _run(self, x, topk_weights, topk_ids, data, out) -> None:
        raise NotImplementedError

    def plan(self, topk_ids) -> Plan:
        raise NotImplementedError

    def plan_inputs(self, tokens: int, routing: str = "uniform") -> dict:
        from hal.synth import random_routing

        _, topk_ids = random_routing(self.spec, tokens, routing)
        return {"topk_ids": topk_ids}


class MaskedMoEKernel(_WeightsKernel):
    """Op "moe_masked", the DeepEP low-latency layout: kernel(x fp8 [E_local, max_m, H], x_scale,
    masked_m, prepared) -> bf16 [E_local, max_m, H]. Rows at or beyond masked_m[e] are never read
    or written."""

    op = "moe_masked"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "plan" in vars(cls):
            cls.plan = _checked_plan(vars(cls)["plan"], _masked_plan_args)

    def __call__(self, x, x_scale, masked_m, prepared: Prepared, expected_rows: Optional[int] = None,
                 out: Optional[torch.Tensor] = None, *, check: bool = True):
        spec: MoESpec = self.spec
        self._check_autograd(out, x=x, x_scale=x_scale)
        if check:
            self._check_prepared(prepared)
            check_masked_inputs(spec.local_experts, spec.hidden_size, self.device, x, x_scale,
                                masked_m, expected_rows)
            require(x.dtype == self.fp8_dtype,
                    f"x has dtype {x.dtype}: expected {self.fp8_dtype}, the target's FP8")
            require(out is None or (isinstance(out, torch.Tensor) and out.shape == x.shape
                                    and out.dtype == torch.bfloat16 and out.device == x.device
                                    and out.is_contiguous()),
                    f"out must be a contiguous bfloat16 tensor of shape {tuple(x.shape)} on {x.device}")
        if out is None:
            out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
        if x.shape[0] and x.shape[1]:
            self._run(x, x_scale, masked_m, prepared.data, out, expected_rows)
        return out

    def _run(self, x, x_scale, masked_m, data, out, expected_rows) -> None:
        raise NotImplementedError

    def plan(self, masked_m, expected_rows: Optional[int] = None, max_m: Optional[int] = None) -> Plan:
        """max_m defaults to the largest count in masked_m."""
        raise NotImplementedError

    def plan_inputs(self, tokens: int, routing: str = "uniform") -> dict:
        """Rows per local expert as DeepEP's dispatcher delivers `tokens` routed tokens, and the
        expected rows it reports: (routes + E) // E."""
        from hal.synth import random_routing

        experts = self.spec.local_experts
        _, topk_ids = random_routing(self.spec, tokens, routing)
        counts = torch.bincount(topk_ids.flatten().long() % experts, minlength=experts).to(torch.int32)
        return {"masked_m": counts, "expected_rows": (int(counts.sum()) + experts) // experts,
                "max_m": int(counts.max()) if experts else 0}


class RequantKernel(KernelBase):
    """Op "requant": kernel(x fp8 [E, max_m, H], x_scale, masked_m, output_scale, out=None,
    expected_rows=None) -> per-tensor FP8 in the target's encoding. Rows at or beyond masked_m[e]
    are never read or written."""

    op = "requant"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "plan" in vars(cls):
            cls.plan = _checked_plan(vars(cls)["plan"], _requant_plan_args)

    def __call__(self, x, x_scale, masked_m, output_scale, out=None, expected_rows=None, *,
                 check: bool = True):
        self._check_autograd(out, x=x, x_scale=x_scale, output_scale=output_scale)
        if check:
            check_masked_inputs(self.spec.num_experts, self.spec.hidden_size, self.device, x,
                                x_scale, masked_m, expected_rows)
            check_requant_args(x, output_scale, out, self.fp8_dtype, "the target's FP8")
        if out is None:
            out = torch.empty(x.shape, dtype=self.fp8_dtype, device=x.device)
        if x.shape[0] and x.shape[1]:
            self._run(x, x_scale, masked_m, output_scale, out, expected_rows)
        return out

    def _run(self, x, x_scale, masked_m, output_scale, out, expected_rows) -> None:
        raise NotImplementedError

    def plan(self, max_m: int, expected_rows: Optional[int] = None) -> Plan:
        raise NotImplementedError

    def plan_inputs(self, tokens: int, routing: str = "uniform") -> dict:
        """`tokens` rows on every expert."""
        return {"max_m": tokens, "expected_rows": tokens}
