"""moe-hal as a Hugging Face transformers experts implementation.

    import hal.integrations.transformers as hal_tf
    hal_tf.register()                                   # once per process
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                 experts_implementation="moe_hal")
    hal_tf.prepare(model)                               # optional: select and repack at load time
    print(hal_tf.explain(model))                        # backend per MoE layer, or why it fell back
    hal_tf.refresh(model)                               # after writing new weights into the model

Every experts class that transformers wraps with `use_experts_implementation` (Qwen3-MoE, GPT-OSS,
Mixtral, DeepSeek-V3, the FP8Experts of fine-grained FP8 checkpoints, ...) dispatches to it. A layer
moe-hal cannot serve runs the module's eager forward and logs why, once, on the logger
"hal.integrations.transformers".

Importing this module lets transformers' models name their experts layers by path when they load
with moe_hal, and turns a request for moe_hal before register() into an error that says to call it."""

from __future__ import annotations

import collections
import functools
import logging
from typing import Optional

import attrs
import torch

from hal.integrations.transformers.layer import dispatching_class, experts_forward, layer_state, log

NAME = "moe_hal"
# LayerReport.backend of a layer whose kernel its first forward selects.
NOT_SELECTED = "not selected"


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


def registered() -> bool:
    """Whether register() has run (in this process)."""
    return all(NAME in interface._global_mapping for interface in _interfaces())


def experts_modules(model) -> list:
    """(name, module) of every experts module that dispatches through an experts interface, its own
    forward or one it inherits and calls through super()."""
    return [(name, m) for name, m in model.named_modules()
            if hasattr(m, "has_gate") and hasattr(m, "is_transposed") and dispatching_class(m) is not None]


def _name_layers(model) -> None:
    for name, module in experts_modules(model):
        layer_state(module, name)


def _watch_model_loads() -> None:
    """Wrap the check every transformers model runs on its experts implementation (when it is built,
    and in set_experts_implementation) and the post_init that ends building it: a request for moe_hal
    before register() raises a ValueError that says to call it, and a model that runs moe_hal names
    its layers by path, for every message."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return
    check = getattr(PreTrainedModel, "get_correct_experts_implementation", None)
    post_init = getattr(PreTrainedModel, "post_init", None)
    if check is None or post_init is None or getattr(check, "_moe_hal", False):
        return

    @functools.wraps(check)
    def checked(self, requested_experts):
        if requested_experts == NAME and not registered():
            raise ValueError(f'experts_implementation="{NAME}" is not registered with transformers: call '
                             "hal.integrations.transformers.register() once before loading the model or "
                             "calling set_experts_implementation")
        applicable = check(self, requested_experts)
        if applicable == NAME:
            _name_layers(self)
        return applicable

    @functools.wraps(post_init)
    def named_post_init(self, *args, **kwargs):
        post_init(self, *args, **kwargs)
        if getattr(self.config, "_experts_implementation", None) == NAME:
            _name_layers(self)

    checked._moe_hal = True
    PreTrainedModel.get_correct_experts_implementation = checked
    PreTrainedModel.post_init = named_post_init


_watch_model_loads()

# Config fields transformers' MoE families keep top_k in, and nested configs that hold them (DBRX).
TOP_K_NAMES = ("num_experts_per_tok", "top_k_experts", "moe_topk", "moe_top_k", "moe_k", "top_k")
TOP_K_HOLDERS = ("ffn_config", "moe_config", "text_config")


def _act_dtype(module) -> torch.dtype:
    """The activation dtype a layer will see: its weights' dtype when they are bf16/fp16, else the
    model config's dtype (FP8 checkpoints run bf16 activations by default)."""
    weight = getattr(module, "gate_up_proj", getattr(module, "up_proj", None))
    if weight is not None and weight.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return weight.dtype
    dtype = getattr(getattr(module, "config", None), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.bfloat16


def load_top_k(module) -> Optional[int]:
    """The top_k the layer's forward will be called with, or None where it cannot be known before the
    first forward: the top_k of the routes it last ran; else the config's, unless a subclass's forward
    reshapes the routes before it dispatches (the config's top_k is then not the one dispatched)."""
    state = layer_state(module)
    if state.top_k is not None:
        return state.top_k
    if dispatching_class(module) is not type(module):
        return None
    config = getattr(module, "config", None)
    for holder in [config] + [getattr(config, name, None) for name in TOP_K_HOLDERS]:
        for name in TOP_K_NAMES:
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


@attrs.frozen
class LayerReport:
    """One MoE layer: the backend selected for it, "eager" where it falls back or its last forward
    did, NOT_SELECTED where its first forward selects; and the selection trace
    (kernel.decision.explain()) or the reason."""

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
    """name -> LayerReport, printable as one block under its summary line."""

    def summary(self) -> str:
        """One line: how many MoE layers, the backends that serve them, how many fall back."""
        counts = collections.Counter(r.backend for r in self.values())
        eager, pending = counts.pop("eager", 0), counts.pop(NOT_SELECTED, 0)
        parts = [f"{n} on {backend}" for backend, n in sorted(counts.items())]
        if pending:
            parts.append(f"{pending} selected at their first forward")
        if eager:
            parts.append(f"{eager} fall back to their eager forward")
        why = " (hal.integrations.transformers.explain(model) says why)" if eager else ""
        return f"moe_hal: {len(self)} MoE layers: {', '.join(parts) or 'none'}{why}"

    def __str__(self):
        return "\n".join([self.summary()] + [str(r) for r in self.values()])


def _select_at_load(state, module, top_k: Optional[int]) -> None:
    """Select for the device the layer's weights are on, the activation dtype it will see and the
    top_k it will be called with, where that is known."""
    if top_k is None:
        return
    weight = getattr(module, "gate_up_proj", getattr(module, "up_proj", None))
    device = weight.device if weight is not None else torch.device("cpu")
    state.select(module, device, _act_dtype(module), top_k)


def prepare(model) -> Report:
    """Select every MoE layer's kernel and repack its weights now (load time) rather than on the
    first forward. Logs one summary line (a warning where a layer falls back), each layer's reason at
    info level; returns explain(model)."""
    for name, module in experts_modules(model):
        state = layer_state(module, name)
        _select_at_load(state, module, load_top_k(module))
        state.prepare(module)
        if state.fallback is not None:
            state.log_once(state.fallback, logging.INFO)
    report = explain(model)
    fell_back = any(r.backend == "eager" for r in report.values())
    log.log(logging.WARNING if fell_back else logging.INFO, "%s", report.summary())
    return report


def refresh(model) -> Report:
    """Select every MoE layer again and repack its weights from the module's tensors as they are now:
    call it after writing new weights into the model where the per-forward check may miss the write
    (a write through `.data` that leaves every sampled element as it was). Returns explain(model)."""
    for name, module in experts_modules(model):
        state = layer_state(module, name)
        top_k = load_top_k(module)
        state.key, state.last_fallback = None, None
        _select_at_load(state, module, top_k)
        state.prepare(module, force=True)
    return explain(model)


def explain(model) -> Report:
    """Each MoE layer's backend and its trace, or why it falls back; a layer whose last forward ran
    eager while a kernel is selected shows eager and why. A layer that has not run yet is selected
    now (without repacking weights), for its weights' device and dtype."""
    report = Report()
    for name, module in experts_modules(model):
        state = layer_state(module, name)
        if state.key is None:
            _select_at_load(state, module, load_top_k(module))
        implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
        if state.key is None:
            backend, detail = NOT_SELECTED, ("the top_k it runs with is read from the routes of its first "
                                             "forward, which selects its kernel")
        elif state.kernel is None:
            backend, detail = "eager", state.fallback
        elif state.last_fallback is not None:
            backend = "eager"
            detail = (f"its last forward ran eager: {state.last_fallback}\n{state.kernel.backend} is "
                      f"selected:\n{state.kernel.decision.explain()}")
        else:
            backend, detail = state.kernel.backend, state.kernel.decision.explain()
        report[name] = LayerReport(name, implementation, backend, detail or "not selected")
    return report


__all__ = ["NAME", "LayerReport", "Report", "experts_modules", "explain", "prepare", "refresh", "register",
           "registered"]
