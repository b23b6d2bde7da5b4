"""The activations between the two GEMMs (docs/contract.md, "What every backend computes")."""

from __future__ import annotations

import torch

from hal.spec import MoESpec


def apply(spec: MoESpec, h: torch.Tensor) -> torch.Tensor:
    """h: [rows, w13_rows] -> [rows, I]."""
    if spec.activation == "silu":
        gate, up = h[:, : spec.intermediate_size], h[:, spec.intermediate_size:]
        return torch.nn.functional.silu(gate) * up
    if spec.activation == "swiglu_oai":
        gate, up = h[:, 0::2], h[:, 1::2]
        limit = spec.swiglu_limit
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
        return gate * torch.sigmoid(spec.swiglu_alpha * gate) * (up + 1)
    return torch.relu(h).square()
