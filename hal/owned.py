"""Prepared weights own their memory (docs/contract.md, "Kernel objects"): an engine that loads layer
after layer through one staging buffer, or edits a tensor it has handed over, must not change a
layer it has already prepared. `owned` copies whatever part of a backend's prepared data still
shares memory with the caller's tensors; parts the backend already repacked are kept as they are."""

from __future__ import annotations

import attrs
import torch


def _span(t: torch.Tensor):
    """(device, first byte, end byte) of the memory a tensor's storage covers, or None if empty."""
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return t.device, storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _overlaps(span, spans) -> bool:
    device, lo, hi = span
    return any(device == d and lo < h and l < hi for d, l, h in spans)


def owned(data, sources):
    """`data` (a tensor, or attrs instances, dicts, lists and tuples holding tensors) with every
    tensor whose memory overlaps one of `sources` replaced by a copy of it."""
    spans = [s for s in (_span(t) for t in sources if isinstance(t, torch.Tensor)) if s is not None]
    return _copy_shared(data, spans) if spans else data


def _copy_shared(data, spans):
    if isinstance(data, torch.Tensor):
        span = _span(data)
        return data.clone() if span is not None and _overlaps(span, spans) else data
    if attrs.has(type(data)):
        changes = {}
        for field in attrs.fields(type(data)):
            value = getattr(data, field.name)
            copied = _copy_shared(value, spans)
            if copied is not value:
                changes[field.alias] = copied
        return attrs.evolve(data, **changes) if changes else data
    if isinstance(data, dict):
        copied = {k: _copy_shared(v, spans) for k, v in data.items()}
        return copied if any(copied[k] is not data[k] for k in data) else data
    if isinstance(data, (list, tuple)):
        copied = [_copy_shared(v, spans) for v in data]
        if all(c is v for c, v in zip(copied, data, strict=True)):
            return data
        return type(data)(*copied) if hasattr(data, "_fields") else type(data)(copied)
    return data
