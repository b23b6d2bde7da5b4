"""One experts module served by moe-hal: the kernel selected for it, its prepared weights, and the
forward that transformers' experts interface calls.

Selection happens once per layer and is redone only when what it depends on changes (device,
activation dtype, top_k); weights are prepared once and rebuilt only when a source tensor changes
(data_ptr, in-place version, device, dtype). Anything moe-hal cannot serve runs the module's own
eager forward, with one log line per layer and reason."""

from __future__ import annotations

import itertools
import logging
from typing import Optional

import torch

import hal
from hal.integrations.transformers.convert import describe, to_weights, weights_key
from hal.integrations.transformers.unsupported import Unsupported

log = logging.getLogger("hal.integrations.transformers")

STATE_ATTR = "_moe_hal_layer"


def eager_forward(module):
    """The module's own forward, which `use_experts_implementation` wraps (functools.wraps keeps it
    as __wrapped__)."""
    forward = type(module).forward
    return getattr(forward, "__wrapped__", forward)


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
    """What moe-hal decided for one experts module."""

    def __init__(self, name: str):
        self.name = name
        self.key = None  # (device, act dtype, top_k) the selection was made for
        self.kernel = None
        self.layout = None
        self.fallback: Optional[str] = None
        self.prepared = None
        self.weights_key = None
        self._logged = set()

    @property
    def backend(self) -> str:
        return "eager" if self.kernel is None else self.kernel.backend

    def log_once(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("moe_hal: %s falls back to its eager forward: %s", self.name, reason)

    def fall_back(self, reason: str) -> None:
        self.kernel, self.layout, self.prepared, self.weights_key = None, None, None, None
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
        self.prepared, self.weights_key = None, None
        log.info("moe_hal: %s runs on %s (%s)", self.name, kernel.backend, layout.spec)

    def prepare(self, module) -> None:
        """Repack the module's weights for the selected kernel unless they are unchanged."""
        if self.kernel is None:
            return
        key = weights_key(module)
        if key == self.weights_key:
            return
        try:
            # Prepared tensors must outlive an inference_mode region they are first built in.
            with torch.inference_mode(False), torch.no_grad():
                self.prepared = self.kernel.prepare_weights(to_weights(module, self.layout))
        except Exception as exc:
            self.fall_back(f"preparing weights failed: {type(exc).__name__}: {exc}")
            return
        self.weights_key = key


_unnamed = itertools.count()


def layer_state(module, name: Optional[str] = None) -> LayerState:
    """The module's state; `name` is its path in the model (prepare() and explain() pass it; a layer
    first met in a forward is numbered in the order the forward reaches it)."""
    state = module.__dict__.get(STATE_ATTR)
    if state is None:
        state = LayerState(name or f"{type(module).__name__} #{next(_unnamed)}")
        module.__dict__[STATE_ATTR] = state
    elif name is not None:
        state.name = name
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
        x = hidden_states.reshape(-1, hidden_states.shape[-1]).contiguous()
        ids, weights = _routes(module, top_k_index.reshape(x.shape[0], -1),
                               top_k_weights.reshape(x.shape[0], -1), x.dtype)
        try:
            # check=False: shapes and dtypes hold by construction, and an id outside [-1, E) never
            # reads or writes out of bounds (docs/contract.md, "What every backend computes").
            return state.kernel(x, weights, ids, state.prepared, check=False).view_as(hidden_states)
        except Exception as exc:
            state.fall_back(f"the {state.kernel.backend} kernel raised {type(exc).__name__}: {exc}")
            reason = state.fallback
    state.log_once(reason)
    return eager_forward(module)(module, hidden_states, top_k_index, top_k_weights)
