"""Fixtures of the triton_moe tests: the float64 oracle and the weights they share."""

from __future__ import annotations

import attrs
import pytest
import torch

from backends.reference import ops
from hal.synth import random_expert_map, random_weights


def _oracle(spec, x, topk_weights, topk_ids, weights) -> torch.Tensor:
    """backends.reference in float64, with dropped (-1) routes given weight 0 on expert 0, so the
    oracle never looks a -1 up in the expert map."""
    dropped = topk_ids < 0
    ids = torch.where(dropped, torch.zeros_like(topk_ids), topk_ids)
    tw = torch.where(dropped, torch.zeros_like(topk_weights), topk_weights)
    return ops.moe_tokens(spec, x, tw, ids, weights, compute_dtype=torch.float64)


def _weights_for(spec, seed: int, device) -> object:
    w = random_weights(spec, device=device, seed=seed)
    if spec.num_local_experts is not None:
        w = attrs.evolve(w, expert_map=random_expert_map(spec, seed=seed + 1, device=device))
    return w


@pytest.fixture
def oracle():
    return _oracle


@pytest.fixture
def weights_for():
    return _weights_for
