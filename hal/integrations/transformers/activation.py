"""Which moe-hal activation a transformers experts module computes, read from the module itself.

The experts classes differ in how they gate: `_default_apply_gate` (silu on concatenated gate/up),
GPT-OSS's clamped SwiGLU on interleaved rows, FP8Experts' variants chosen by config fields, or an
activation a model defines for itself. Flags and config names do not say all of it, so the module's
own gate is evaluated on a fixed probe and compared with each candidate moe-hal can run."""

from __future__ import annotations

from typing import Optional

import attrs
import torch

from hal.integrations.transformers.unsupported import Unsupported

# Relative agreement a candidate must reach on the probe (both evaluated in float32).
MATCH_TOLERANCE = 1e-5
PROBE_ROWS = 8
# Probe values reach past GPT-OSS's clamp limit (7.0) on both signs, so a clamp shows; where the
# module or its config names a larger limit, the probe reaches twice as far as that limit.
PROBE_RANGE = 12.0
LIMIT_NAMES = ("limit", "swiglu_limit", "clamp_limit", "activation_limit")


@attrs.frozen
class Activation:
    """name: the MoESpec activation; order: how the module stores gate and up rows
    ("concatenated" [gate; up], "interleaved" gate0, up0, ..., or "single" for non-gated)."""

    name: str
    order: str
    alpha: Optional[float] = None
    limit: Optional[float] = None


def _probe(width: int, reach: float, device) -> torch.Tensor:
    """Deterministic values in [-reach, reach], scattered so gate and up columns differ."""
    n = PROBE_ROWS * width
    values = torch.linspace(-reach, reach, n, dtype=torch.float64)
    # Multiplying by a prime that does not divide n permutes [0, n).
    stride = 7919 if n % 7919 else 1
    order = (torch.arange(n, dtype=torch.int64) * stride) % n
    return values[order].reshape(PROBE_ROWS, width).to(torch.float32).to(device)


def _split(t: torch.Tensor, order: str):
    if order == "concatenated":
        return t.chunk(2, dim=-1)
    return t[..., ::2], t[..., 1::2]


def _silu(t, order, alpha, limit):
    gate, up = _split(t, order)
    return torch.nn.functional.silu(gate) * up


def _swiglu_oai(t, order, alpha, limit):
    gate, up = _split(t, order)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def _relu2(t, order, alpha, limit):
    return torch.relu(t).square()


def _first(objects, names):
    for obj in objects:
        for name in names:
            value = getattr(obj, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    return None


def _sources(module):
    return (module, getattr(module, "config", None))


def _candidates(module):
    alpha = _first(_sources(module), ("alpha", "swiglu_alpha"))
    limit = _first(_sources(module), LIMIT_NAMES)
    if not getattr(module, "has_gate", True):
        return [(Activation("relu2", "single"), _relu2)]
    found = []
    for order in ("concatenated", "interleaved"):
        found.append((Activation("silu", order), _silu))
        if alpha is not None and limit is not None and limit > 0:
            found.append((Activation("swiglu_oai", order, alpha, limit), _swiglu_oai))
    return found


def detect(module, intermediate: int, device) -> Activation:
    """The activation and gate/up order the module computes, or Unsupported saying why not."""
    gated = getattr(module, "has_gate", True)
    limit = _first(_sources(module), LIMIT_NAMES)
    reach = PROBE_RANGE if limit is None or not limit > 0 else max(PROBE_RANGE, 2.0 * limit)
    probe = _probe(2 * intermediate if gated else intermediate, reach, device)
    try:
        with torch.no_grad():
            got = (module._apply_gate(probe) if gated else module.act_fn(probe)).float()
    except Exception as exc:  # a gate that cannot run on a float32 probe is not one we can match
        raise Unsupported(f"evaluating the module's {'_apply_gate' if gated else 'act_fn'} on a probe "
                          f"raised {type(exc).__name__}: {exc}") from exc
    tried = []
    for activation, fn in _candidates(module):
        want = fn(probe, activation.order, activation.alpha, activation.limit)
        if want.shape == got.shape:
            err = float((got - want).norm() / want.norm().clamp_min(1e-30))
            if err <= MATCH_TOLERANCE:
                return activation
        tried.append(f"{activation.name} ({activation.order})")
    what = "_apply_gate" if gated else "act_fn"
    clamp = ""
    if limit is not None:
        clamp = (f"; the module has a clamp limit of {limit:g}, and moe-hal clamps only in GPT-OSS's "
                 "swiglu_oai, not a clamped silu")
    raise Unsupported(f"the module's {what} ({type(module).__name__}) matches none of the activations "
                      f"moe-hal runs on values in [-{reach:g}, {reach:g}]: tried {', '.join(tried)}{clamp}")
