"""Whether the tensors a layer's prepared weights were made from have changed since.

Writes through a parameter bump its version counter, and `param.data = t` replaces its storage; both
show in the tensors' metadata. A write through the `.data` alias (`param.data.copy_(t)`, the usual
way RL trainers push new weights into a serving model) bumps only the alias's own counter, so the
metadata cannot see it: a fixed sample of each tensor's elements, compared bit for bit, does. The
sample covers every expert; a write that changes none of the sampled elements needs refresh(). On a
GPU the sample is not read (a host read per layer and forward would stall the queue): there, writes
through `.data` need refresh()."""

from __future__ import annotations

import torch

from hal.integrations.transformers.convert import source_tensors

# Sampled elements per expert and per tensor, and the least per tensor.
SAMPLES_PER_EXPERT = 2
MIN_SAMPLES = 64
# Same-size integer views, so the comparison is bitwise (NaN equals itself, -0.0 differs from 0.0).
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _metadata(tensors: dict) -> tuple:
    return tuple((name, t.data_ptr(), t._version, t.device, t.dtype, tuple(t.shape), t.stride())
                 for name, t in tensors.items())


def sample_positions(t: torch.Tensor) -> torch.Tensor:
    """Flat (row-major) indices of the elements sampled from `t`: evenly spaced over the tensor, so
    each expert's slice holds some, and each moved by a different offset within its stretch, so they do
    not all fall in one column."""
    n = t.numel()
    count = min(n, max(MIN_SAMPLES, SAMPLES_PER_EXPERT * (t.shape[0] if t.dim() else 1)))
    if count == 0:
        return torch.zeros(0, dtype=torch.int64)
    i = torch.arange(count, dtype=torch.int64)
    return (i * n) // count + (i * 7919) % max(n // count, 1)


def _sample(tensors: dict, positions: dict) -> torch.Tensor:
    parts = [torch.take(t.view(_BITS[t.element_size()]), positions[name]).to(torch.int64)
             for name, t in tensors.items()]
    return torch.cat(parts)


class WeightsWatch:
    """The source tensors' metadata and sampled elements at one moment; changed(module) says whether
    the module's tensors differ from them now."""

    def __init__(self, module):
        tensors = self._tensors(module)
        self.metadata = _metadata(tensors)
        self.positions = {name: sample_positions(t).to(t.device) for name, t in tensors.items()}
        with torch.no_grad():
            self.sample = _sample(tensors, self.positions)

    @staticmethod
    def _tensors(module) -> dict:
        return {name: t for name, t in source_tensors(module).items() if t is not None}

    def changed(self, module) -> bool:
        tensors = self._tensors(module)
        if _metadata(tensors) != self.metadata:
            return True
        if any(t.device.type != "cpu" for t in tensors.values()):
            # Reading a sample back would stall every forward on the queued work (and a capturing
            # stream may not be read at all): on a GPU, writes through `.data` need refresh().
            return False
        with torch.no_grad():
            return not torch.equal(_sample(tensors, self.positions), self.sample)
