"""moe-hal as a Hugging Face transformers experts implementation.

    import hal.integrations.transformers as hal_tf
    hal_tf.register()                                   # once per process
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                 experts_implementation="moe_hal")
    hal_tf.prepare(model)                               # optional: select and repack at load time
    print(hal_tf.explain(model))                        # backend per MoE layer, or why it fell back

Every experts class that transformers wraps with `use_experts_implementation` (Qwen3-MoE, GPT-OSS,
Mixtral, DeepSeek-V3, the FP8Experts of fine-grained FP8 checkpoints, ...) dispatches to it. A layer
moe-hal cannot serve runs the module's eager forward and logs why, once, on the logger
"hal.integrations.transformers"."""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from hal.integrations.transformers.layer import experts_forward, layer_state

NAME = "moe_hal"


def _interfaces():
    try:
        from transformers.integrations.finegrained_fp8 import FP8ExpertsInterface
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as exc:
        raise ImportError("hal.integrations.transformers needs transformers 5 with experts interfaces: "
                          "pip install 'moe-hal[transformers]'") from exc
    return ExpertsInterface, FP8ExpertsInterface


def register() -> None:
    """Add "moe_hal" to transformers' experts interface and to its FP8 experts interface, so
    `experts_implementation="moe_hal"` and `model.set_experts_implementation("moe_hal")` accept it.
    Calling it again changes nothing."""
    for interface in _interfaces():
        interface.register(NAME, experts_forward)


def experts_modules(model) -> list:
    """(name, module) of every experts module that dispatches through an experts interface."""
    return [(name, m) for name, m in model.named_modules()
            if hasattr(m, "has_gate") and hasattr(m, "is_transposed")
            and hasattr(type(m).forward, "__wrapped__")]


def _act_dtype(module) -> torch.dtype:
    """The activation dtype a layer will see: its weights' dtype when they are bf16/fp16, else the
    model config's dtype (FP8 checkpoints run bf16 activations by default)."""
    weight = getattr(module, "gate_up_proj", getattr(module, "up_proj", None))
    if weight is not None and weight.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return weight.dtype
    dtype = getattr(getattr(module, "config", None), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.bfloat16


def _top_k(module) -> int:
    config = getattr(module, "config", None)
    for name in ("num_experts_per_tok", "top_k", "moe_topk"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return 1


@attrs.frozen
class LayerReport:
    """One MoE layer: the backend that runs it ("eager" when it falls back), and the selection trace
    (kernel.decision.explain()) or the reason it falls back."""

    name: str
    implementation: Optional[str]
    backend: str
    detail: str

    def __str__(self):
        head = f"{self.name}: {self.backend}"
        if self.implementation != NAME:
            head += f" (experts_implementation={self.implementation!r}, not {NAME!r})"
        return head + "\n  " + self.detail.replace("\n", "\n  ")


class Report(dict):
    """name -> LayerReport, printable as one block."""

    def __str__(self):
        return "\n".join(str(r) for r in self.values())


def _select_at_load(state, module) -> None:
    """Select for the device the layer's weights are on and the activation dtype it will see."""
    weight = getattr(module, "gate_up_proj", getattr(module, "up_proj", None))
    device = weight.device if weight is not None else torch.device("cpu")
    state.select(module, device, _act_dtype(module), _top_k(module))


def prepare(model) -> Report:
    """Select every MoE layer's kernel and repack its weights now (load time) rather than on the
    first forward; returns explain(model)."""
    for name, module in experts_modules(model):
        state = layer_state(module, name)
        _select_at_load(state, module)
        state.prepare(module)
    return explain(model)


def explain(model) -> Report:
    """Each MoE layer's backend and its trace, or why it falls back. A layer that has not run yet is
    selected now (without repacking weights), for its weights' device and dtype."""
    report = Report()
    for name, module in experts_modules(model):
        state = layer_state(module, name)
        if state.key is None:
            _select_at_load(state, module)
        implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
        detail = state.fallback if state.kernel is None else state.kernel.decision.explain()
        report[name] = LayerReport(name, implementation, state.backend, detail or "not selected")
    return report


__all__ = ["NAME", "LayerReport", "Report", "experts_modules", "explain", "prepare", "register"]
