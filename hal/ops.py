"""The ops moe-hal serves, in one table that the registry, the CLI and the docs all read.

Each op has one spec type, one calling convention (its kernel template in hal.kernel), one
`plan()` signature and one override variable:

    op          spec                          template                  override variable
    moe         MoESpec, layout="tokens"      hal.kernel.MoEKernel      HAL_MOE_BACKEND
    moe_masked  MoESpec, layout="masked"      hal.kernel.MaskedMoEKernel HAL_MOE_MASKED_BACKEND
    requant     RequantSpec                   hal.kernel.RequantKernel  HAL_REQUANT_BACKEND

This module imports no torch: selection (and `hal probe`) reads it; the templates are named here
and imported only when a kernel is built or checked against its template."""

from __future__ import annotations

import importlib
from typing import Optional

import attrs

from hal.spec import MoESpec, RequantSpec


@attrs.frozen
class Op:
    name: str  # what backends list in `ops` and the trace prints
    spec_type: type
    layout: Optional[str]  # MoESpec.layout that selects this op; None when the spec type decides
    override_variable: str  # names the backend to force for this op only
    template: str  # "module:Class" of the kernel template every backend's kernel subclasses
    call: str  # the calling convention, as docs and error messages show it
    plan: str  # the plan() signature

    def matches(self, spec) -> bool:
        return type(spec) is self.spec_type and (self.layout is None or spec.layout == self.layout)

    def template_class(self) -> type:
        """The kernel template (imports torch)."""
        module, _, name = self.template.partition(":")
        return getattr(importlib.import_module(module), name)


OPS = (
    Op("moe", MoESpec, "tokens", "HAL_MOE_BACKEND", "hal.kernel:MoEKernel",
       "kernel(x [M, H], topk_weights [M, k] fp32, topk_ids [M, k] int32, prepared, out=None, *, "
       "check=True) -> [M, H]",
       "plan(topk_ids)"),
    Op("moe_masked", MoESpec, "masked", "HAL_MOE_MASKED_BACKEND", "hal.kernel:MaskedMoEKernel",
       "kernel(x fp8 [E_local, max_m, H], x_scale fp32 [E_local, max_m, H/128], masked_m int32 "
       "[E_local], prepared, expected_rows=None, out=None, *, check=True) -> bf16 [E_local, max_m, H]",
       "plan(masked_m, expected_rows=None, max_m=None)"),
    Op("requant", RequantSpec, None, "HAL_REQUANT_BACKEND", "hal.kernel:RequantKernel",
       "kernel(x fp8 [E, max_m, H], x_scale, masked_m, output_scale fp32 [1], out=None, "
       "expected_rows=None, *, check=True) -> fp8 [E, max_m, H]",
       "plan(max_m, expected_rows=None)"),
)
OP_NAMES = tuple(op.name for op in OPS)
BY_NAME = {op.name: op for op in OPS}


def op_of(spec) -> Op:
    """The op a spec asks for; ValueError naming `spec` when it is none of them."""
    for op in OPS:
        if op.matches(spec):
            return op
    raise ValueError(f"spec must be hal.MoESpec or hal.RequantSpec, got {type(spec).__name__}")


def get(name: str) -> Op:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"op={name!r} is not allowed: expected one of {', '.join(OP_NAMES)}") from None
