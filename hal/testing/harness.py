"""The pieces every conformance test uses: a kernel selected by name for a case, random weights for
it, the float64 oracle, and a call whose output lies inside a larger poisoned buffer so a write
outside the output shows."""

from __future__ import annotations

import functools

import attrs
import torch

from hal import synth
from hal.testing.accuracy import ACCURACY, rel_err
from hal.testing.poison import is_poison, poison

MARGIN = 67  # poisoned elements either side of an output view: odd, so no vector width hides a write


@attrs.frozen
class Built:
    kernel: object
    weights: object
    prepared: object


def expert_map(spec, device: str, seed: int = 0) -> torch.Tensor:
    """Local experts scattered over the global range, the last global expert always among them, so
    a -1 id read as a Python-style index (expert_map[-1]) lands on a local expert and shows."""
    g = torch.Generator().manual_seed(seed)
    others = torch.randperm(spec.num_experts - 1, generator=g)[: spec.local_experts - 1]
    chosen = torch.cat([others, torch.tensor([spec.num_experts - 1])])
    mapping = torch.full((spec.num_experts,), -1, dtype=torch.int32)
    mapping[chosen] = torch.randperm(spec.local_experts, generator=g).to(torch.int32)
    return mapping.to(device)


def weights_for(spec, device: str, seed: int = 0):
    """Random checkpoint-format weights for the spec, with an expert_map under EP."""
    weights = synth.random_weights(spec, device=device, seed=seed)
    if spec.is_ep:
        weights = attrs.evolve(weights, expert_map=expert_map(spec, device, seed + 1))
    return weights


@functools.cache
def discovered() -> tuple:
    """The entry points, loaded once per process."""
    from hal.registry import discover

    return tuple(discover())


def select(case):
    """The case's backend, forced with prefer= so selection itself is part of what is tested."""
    import hal

    pick = hal.select_requant_kernel if case.op == "requant" else hal.select_moe_kernel
    return pick(case.spec, case.device, caps=case.caps, prefer=case.backend, backends=discovered())


@functools.cache
def built(case) -> Built:
    """One kernel, weights and prepared weights per case, shared by its tests."""
    kernel = select(case)
    if case.op == "requant":
        return Built(kernel, None, None)
    weights = weights_for(case.spec, case.device, seed=len(case.spec_id))
    return Built(kernel, weights, kernel.prepare_weights(weights))


def token_inputs(spec, M: int, device: str, seed: int, mode: str = "uniform", **routing):
    x = synth.random_tokens(spec, M, seed=seed, device=device)
    tw, ti = synth.random_routing(spec, M, mode=mode, seed=seed + 1, device=device, **routing)
    return x, tw, ti


def token_oracle(spec, x, topk_weights, topk_ids, weights) -> torch.Tensor:
    """float64 evaluation of docs/contract.md's formula on the dequantized weights. A dropped route (-1)
    adds nothing: it is evaluated as a route of weight zero to expert 0, so the oracle does not
    depend on how its own indexing treats -1."""
    from hal.backends.reference import ops  # the executable contract

    dropped = topk_ids < 0
    tw = torch.where(dropped, torch.zeros_like(topk_weights), topk_weights)
    ti = torch.where(dropped, torch.zeros_like(topk_ids), topk_ids)
    ref = ops.moe_tokens(spec, x.double(), tw.double(), ti, weights, compute_dtype=torch.float64)
    return ref


def masked_oracle(spec, x, x_scale, masked_m, weights) -> torch.Tensor:
    from hal.backends.reference import ops

    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    return ops.moe_masked(spec, x, x_scale, masked_m, weights, out, compute_dtype=torch.float64)


def poisoned_view(shape, dtype, device):
    """(buffer, view): a contiguous view of `shape` at an odd offset inside a poisoned buffer with
    MARGIN elements either side."""
    n = 1
    for d in shape:
        n *= d
    buffer = poison(torch.empty(n + 2 * MARGIN, dtype=dtype, device=device))
    return buffer, buffer[MARGIN:MARGIN + n].view(shape)


def assert_margins_intact(buffer, view) -> None:
    n = view.numel()
    head, tail = buffer[:MARGIN], buffer[MARGIN + n:]
    assert bool(is_poison(head).all()) and bool(is_poison(tail).all()), \
        "the kernel wrote outside the out= tensor it was given"


def assert_returns_out(result, out) -> None:
    assert isinstance(result, torch.Tensor), f"the call returned {type(result).__name__}, not out"
    assert result.data_ptr() == out.data_ptr() and result.shape == out.shape \
        and result.stride() == out.stride(), "out= was given but the call returned another tensor"


def assert_accurate(out, ref, what: str = "") -> None:
    assert not bool(is_poison(out).any()), f"{what}output elements left unwritten (still poisoned)"
    err = rel_err(out, ref)
    assert err <= ACCURACY, f"{what}||out - ref|| / ||ref|| = {err:.3e} > {ACCURACY}"


def fp8_dtype(case) -> torch.dtype:
    """The FP8 encoding activations arrive in on the case's device: e4m3fnuz where the GPU's FP8 is
    fnuz (gfx942), OCP e4m3fn elsewhere."""
    from hal.backend import Target

    gpu = Target(case.device, case.caps).gpu
    return torch.float8_e4m3fnuz if gpu is not None and gpu.features.fp8 == "fnuz" else torch.float8_e4m3fn
