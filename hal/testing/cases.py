"""What the conformance suite runs: every discovered backend, every op it declares, on every device
of this machine, for each spec of a fixed list that its check() accepts there."""

from __future__ import annotations

import functools
import os
from typing import Optional

import attrs

from hal import ops
from hal.backend import Target, checked
from hal.caps import Caps
from hal.spec import MoESpec, RequantSpec

# Small layers: sizes that are valid but not powers of two, H != I, ragged FP8 scale blocks, top_k
# from 1 to num_experts, EP with local experts scattered over the global range.
MOE_SPECS = {
    "bf16-silu": MoESpec(num_experts=8, top_k=2, hidden_size=96, intermediate_size=160),
    "bf16-relu2-bias-topk_all": MoESpec(num_experts=4, top_k=4, hidden_size=64, intermediate_size=96,
                                        activation="relu2", has_bias=True),
    "fp8-silu-ragged": MoESpec(num_experts=8, top_k=2, hidden_size=160, intermediate_size=96,
                               weight_format="fp8_block128"),
    "fp8-swiglu-bias-ep": MoESpec(num_experts=12, top_k=3, hidden_size=96, intermediate_size=160,
                                  weight_format="fp8_block128", activation="swiglu_oai",
                                  has_bias=True, num_local_experts=5),
    "fp8-relu2-top1": MoESpec(num_experts=6, top_k=1, hidden_size=64, intermediate_size=32,
                              weight_format="fp8_block128", activation="relu2"),
    "mxfp4-swiglu-bias": MoESpec(num_experts=8, top_k=2, hidden_size=64, intermediate_size=96,
                                 weight_format="mxfp4", activation="swiglu_oai", has_bias=True),
    "mxfp4-silu-ep": MoESpec(num_experts=10, top_k=2, hidden_size=96, intermediate_size=64,
                             weight_format="mxfp4", num_local_experts=4),
    "int4-silu": MoESpec(num_experts=6, top_k=2, hidden_size=128, intermediate_size=256,
                         weight_format="int4_g128"),
    "int4-perchannel-relu2-bias-ep": MoESpec(num_experts=8, top_k=3, hidden_size=192,
                                             intermediate_size=64, weight_format="int4_g128",
                                             activation="relu2", has_bias=True, group_size=-1,
                                             num_local_experts=3),
    "int4-fp16-swiglu": MoESpec(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128,
                                weight_format="int4_g128", activation="swiglu_oai",
                                act_dtype="float16"),
    "fp8-w8a8-silu-ragged": MoESpec(num_experts=8, top_k=2, hidden_size=160, intermediate_size=96,
                                    weight_format="fp8_block128", act_quant="fp8_g128"),
    "fp8-w8a8-swiglu-bias-ep": MoESpec(num_experts=12, top_k=3, hidden_size=256, intermediate_size=160,
                                       weight_format="fp8_block128", activation="swiglu_oai",
                                       has_bias=True, num_local_experts=5, act_quant="fp8_g128"),
}
MASKED_SPECS = {
    "w4afp8-silu": MoESpec(num_experts=3, top_k=2, hidden_size=256, intermediate_size=128,
                           weight_format="w4afp8", layout="masked"),
    "w4afp8-swiglu-ep": MoESpec(num_experts=8, top_k=2, hidden_size=128, intermediate_size=128,
                                weight_format="w4afp8", layout="masked", activation="swiglu_oai",
                                num_local_experts=2),
}
REQUANT_SPECS = {
    "requant-e5-h384": RequantSpec(num_experts=5, hidden_size=384),
    "requant-e2-h128": RequantSpec(num_experts=2, hidden_size=128),
}
SPECS = {**MOE_SPECS, **MASKED_SPECS, **REQUANT_SPECS}


def isolated_spec(spec) -> bool:
    """The token specs whose check=False out-of-range call runs in a child Python: every EP spec
    and the plain bf16 one, which reach each backend's id lookup with and without expert_map."""
    return spec.is_ep or (spec.weight_format == "bf16" and spec.activation == "silu")


def op_of(spec) -> str:
    """The name of the op a spec asks for: "moe", "moe_masked" or "requant"."""
    return ops.op_of(spec).name


def serves(backend, spec) -> bool:
    """Whether the backend declares the op of this spec."""
    return op_of(spec) in backend.ops


def interpreted(device: str, notes) -> bool:
    """The backend says it runs in Triton's interpreter on CPU (TRITON_INTERPRET=1)."""
    return (device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
            and any("interpret" in note.lower() for note in notes))


@attrs.frozen
class Case:
    backend: str
    device: str
    spec_id: str
    spec: object
    caps: Caps = attrs.field(eq=False, repr=False)
    notes: tuple = attrs.field(eq=False, repr=False)

    @property
    def op(self) -> str:
        return op_of(self.spec)

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.device}-{self.spec_id}"

    @property
    def interpreted(self) -> bool:
        return interpreted(self.device, self.notes)


@attrs.frozen
class Unavailable:
    """A (backend, op, device) with nothing to run, and why: shown as a skip."""

    backend: str
    op: str
    device: str
    reason: str

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.device}-{self.op}"


def devices() -> list:
    """(device, caps) for this machine: the CPU as probed, and each CUDA device torch sees."""
    from hal.testing.machine import live_cpu_caps

    found = [("cpu", live_cpu_caps())]
    import torch

    if torch.cuda.is_available():
        from hal.probe import probe

        caps = probe(deep=True)
        found += [(f"cuda:{i}", caps) for i in range(torch.cuda.device_count())]
    return found


@functools.cache
def all_cases() -> tuple:
    """Every Case and Unavailable of this machine, in a stable order."""
    from hal.testing.harness import discovered

    out = []
    for found in discovered():
        if found.backend is None:
            out.append(Unavailable(found.name, "*", "*", found.error))
            continue
        backend = found.backend
        for device, caps in devices():
            target = Target(device, caps)
            for op in ("moe", "moe_masked", "requant"):
                specs = {k: s for k, s in SPECS.items() if op_of(s) == op and serves(backend, s)}
                if not specs:
                    continue
                accepted, why = [], []
                for spec_id, spec in specs.items():
                    verdict = checked(backend, spec, target)
                    if verdict.ok:
                        accepted.append(Case(backend.name, device, spec_id, spec, caps, verdict.notes))
                    else:
                        why.append(f"{spec_id}: {verdict.summary()}")
                out += accepted or [Unavailable(backend.name, op, device,
                                                "accepts none of the conformance specs: " + " | ".join(why))]
    return tuple(out)


def cases_for(op: str, where=None) -> list:
    """The cases of one op, optionally filtered by a predicate on the spec; Unavailable entries of
    that op (or of a backend that did not load) come along so the skip shows its reason."""
    picked = []
    for case in all_cases():
        if isinstance(case, Unavailable):
            if case.op in (op, "*"):
                picked.append(case)
        elif case.op == op and (where is None or where(case.spec)):
            picked.append(case)
    return picked


def spec_from_dict(kind: str, fields: dict):
    return (RequantSpec if kind == "RequantSpec" else MoESpec)(**fields)


def caps_for(device: str) -> Optional[Caps]:
    return dict(devices()).get(device)
