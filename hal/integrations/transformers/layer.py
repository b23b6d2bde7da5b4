"""One experts module served by moe-hal: the kernel selected for it, its prepared weights, and the
forward that transformers' experts interface calls.

Selection happens once per layer and is redone only when what it depends on changes (device,
activation dtype, top_k); weights are prepared once and rebuilt when a source tensor changes
(watch.py) or on refresh(). Anything moe-hal cannot serve runs the module's own eager forward, with
one log line per layer and reason."""

from __future__ import annotations

import itertools
import logging
from typing import Optional

import torch

import hal
from hal.integrations.transformers.convert import describe, to_weights
from hal.integrations.transformers.unsupported import Unsupported
from hal.integrations.transformers.watch import WeightsWatch

log = logging.getLogger("hal.integrations.transformers")

STATE_ATTR = "_moe_hal_layer"
# Kernel errors that the same call would raise again (bad shapes, types, an unsupported case): the
# layer stays eager. Any other error (out of memory, a busy device) falls back for that call only.
DETERMINISTIC_ERRORS = (ValueError, TypeError, NotImplementedError)


def dispatching_class(module) -> Optional[type]:
    """The class in the module's MRO whose forward `use_experts_implementation` wrapped (it keeps the
    eager forward as __wrapped__); a subclass may override forward and call it through super()."""
    for cls in type(module).__mro__:
        forward = cls.__dict__.get("forward")
        if forward is not None and hasattr(forward, "__wrapped__"):
            return cls
    return None


def eager_forward(module):
    """The eager forward the dispatching forward wraps. A fallback calls this one, never the dispatching
    forward or a subclass's forward that calls it, which would dispatch to moe_hal again."""
    cls = dispatching_class(module)
    if cls is None:
        return type(module).forward
    return cls.__dict__["forward"].__wrapped__


def _device_name(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    raise Unsupported(f"tensors are on {device}: moe-hal selects kernels for 'cpu' and 'cuda' devices")


def _needs_autograd(module, hidden_states: torch.Tensor) -> bool:
    if not torch.is_grad_enabled():
        return False
    return hidden_states.requires_grad or any(p.requires_grad for p in module.parameters(recurse=False))


class LayerState:
    """What moe-hal decided for one experts module, and what its last forward ran."""

    def __init__(self, name: str):
        self.name = name
        self.key = None  # (device, act dtype, top_k) the selection was made for
        self.kernel = None
        self.layout = None
        self.fallback: Optional[str] = None
        self.prepared = None
        self.watch: Optional[WeightsWatch] = None
        # Why the last forward ran eager while a kernel is selected (autograd, tracing, a transient
        # kernel error); None when it ran the kernel or has not run.
        self.last_fallback: Optional[str] = None
        self._logged = set()

    @property
    def backend(self) -> str:
        return "eager" if self.kernel is None else self.kernel.backend

    @property
    def top_k(self) -> Optional[int]:
        return None if self.key is None else self.key[2]

    def rename(self, name: str) -> None:
        """Keep the longest path a layer is known by: a base model inside a CausalLM names its layers
        without the CausalLM's prefix."""
        if not self.name.endswith("." + name):
            self.name = name

    def log_once(self, reason: str, level: int = logging.WARNING) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.log(level, "moe_hal: %s falls back to its eager forward: %s", self.name, reason)

    def fall_back(self, reason: str) -> None:
        self.kernel, self.layout, self.prepared, self.watch = None, None, None, None
        self.fallback = reason

    def select(self, module, device: torch.device, act_dtype: torch.dtype, top_k: int) -> None:
        """Choose the layer's kernel for this device, dtype and top_k (no-op if already chosen)."""
        key = (device, act_dtype, top_k)
        if key == self.key:
            return
        self.key = key
        try:
            layout = describe(module, act_dtype, top_k)
            kernel = hal.select_moe_kernel(layout.spec, _device_name(device))
            if kernel.backend == "reference" and kernel.decision.forced_by is None:
                raise Unsupported("only the reference backend accepts this layer here, and the module's "
                                  "eager forward is the faster oracle:\n" + kernel.decision.explain())
            kernel.compile()
        except Unsupported as exc:
            self.fall_back(exc.reason)
            return
        except Exception as exc:  # no kernel, a failed build: the model must keep generating
            self.fall_back(f"selecting a kernel failed: {type(exc).__name__}: {exc}")
            return
        self.kernel, self.layout, self.fallback = kernel, layout, None
        self.prepared, self.watch = None, None
        log.debug("moe_hal: %s runs on %s (%s)", self.name, kernel.backend, layout.spec)

    def prepare(self, module, force: bool = False) -> None:
        """Repack the module's weights for the selected kernel unless they are unchanged (always when
        `force`)."""
        if self.kernel is None:
            return
        if not force and self.watch is not None and not self.watch.changed(module):
            return
        try:
            # Prepared tensors must outlive an inference_mode region they are first built in.
            with torch.inference_mode(False), torch.no_grad():
                watch = WeightsWatch(module)
                self.prepared = self.kernel.prepare_weights(to_weights(module, self.layout))
        except Exception as exc:
            self.fall_back(f"preparing weights failed: {type(exc).__name__}: {exc}")
            return
        self.watch = watch


_unnamed = itertools.count()


def layer_state(module, name: Optional[str] = None) -> LayerState:
    """The module's state; `name` is its path in the model (the load hook, prepare() and explain()
    pass it; a layer first met in a forward outside any model is numbered in the order the forward
    reaches it)."""
    state = module.__dict__.get(STATE_ATTR)
    if state is None:
        state = LayerState(name or f"{type(module).__name__} #{next(_unnamed)}")
        module.__dict__[STATE_ATTR] = state
    elif name is not None:
        state.rename(name)
    return state


def _routes(module, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, act_dtype: torch.dtype):
    """transformers' router outputs in the kernel's convention: int32 ids with -1 for no route
    (expert parallelism marks off-rank routes with ids >= the local expert count), and weights in
    float32 or the activation dtype."""
    ids = top_k_index.to(torch.int32)
    if getattr(module, "_is_expert_parallel", False):
        ids = ids.masked_fill(ids >= module.num_experts, -1)
    weights = top_k_weights
    if weights.dtype not in (torch.float32, act_dtype):
        weights = weights.float()
    return ids.contiguous(), weights.contiguous()


def _run_kernel(state: LayerState, module, hidden_states, top_k_index, top_k_weights):
    """(output, None), or (None, why the call falls back)."""
    x = hidden_states.reshape(-1, hidden_states.shape[-1]).contiguous()
    ids, weights = _routes(module, top_k_index.reshape(x.shape[0], -1),
                           top_k_weights.reshape(x.shape[0], -1), x.dtype)
    backend = state.kernel.backend
    try:
        # check=False: shapes and dtypes hold by construction, and an id outside [-1, E) never
        # reads or writes out of bounds (docs/contract.md, "What every backend computes").
        return state.kernel(x, weights, ids, state.prepared, check=False).view_as(hidden_states), None
    except DETERMINISTIC_ERRORS as exc:
        state.fall_back(f"the {backend} kernel raised {type(exc).__name__}: {exc}; the same call would "
                        "raise again, so the layer runs eager from now on")
        return None, state.fallback
    except Exception as exc:
        return None, (f"the {backend} kernel raised {type(exc).__name__}: {exc}; this call runs eager and "
                      "the next one tries the kernel again")


def experts_forward(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The "moe_hal" experts implementation: (hidden_states [M, H], top_k_index [M, k],
    top_k_weights [M, k]) -> [M, H], the weighted sum of the routed experts."""
    state = layer_state(module)
    reason = None
    if torch.compiler.is_compiling():
        reason = "torch.compile is tracing the model: moe-hal's selection and repacking run outside graphs"
    elif _needs_autograd(module, hidden_states):
        reason = ("autograd is recording and the weights or inputs require grad: moe-hal kernels have no "
                  "backward; run inference under torch.no_grad() or torch.inference_mode()")
    else:
        state.select(module, hidden_states.device, hidden_states.dtype, int(top_k_index.shape[-1]))
        state.prepare(module)
        reason = state.fallback
    if reason is None:
        out, reason = _run_kernel(state, module, hidden_states, top_k_index, top_k_weights)
        if reason is None:
            state.last_fallback = None
            return out
    state.last_fallback = reason if state.kernel is not None else None
    state.log_once(reason)
    return eager_forward(module)(module, hidden_states, top_k_index, top_k_weights)
