"""Poisoned outputs: fill an output with a value no kernel writes, so unwritten elements show."""

from __future__ import annotations

import torch

# The byte a 1-byte tensor is poisoned with: NaN in each FP8 encoding (0x7F would be +240, the
# saturation value, in e4m3fnuz), and a sentinel in uint8.
POISON_BYTE = 0x7F
POISON_BYTE_FNUZ = 0x80


def _poison_byte(dtype) -> int:
    return POISON_BYTE_FNUZ if dtype == torch.float8_e4m3fnuz else POISON_BYTE


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill a tensor with a value no kernel writes, so unwritten elements show: NaN for float
    tensors (FP8 included), POISON_BYTE for uint8, -1 for integers."""
    if t.element_size() == 1:
        t.view(torch.uint8).fill_(_poison_byte(t.dtype))
    else:
        t.fill_(float("nan") if t.dtype.is_floating_point else -1)
    return t


def is_poison(t: torch.Tensor) -> torch.Tensor:
    """Elementwise: still holds the poison."""
    if t.element_size() == 1:
        return t.view(torch.uint8) == _poison_byte(t.dtype)
    return torch.isnan(t) if t.dtype.is_floating_point else t == -1


def assert_masked_rows(out: torch.Tensor, ref: torch.Tensor, masked_m) -> None:
    """Masked layout [E, max_m, ...]: out's live rows equal ref's byte for byte and none is poison;
    rows at or beyond masked_m[e] still hold their poison."""
    for e, m in enumerate(masked_m.tolist()):
        assert torch.equal(out[e, :m].view(torch.uint8), ref[e, :m].view(torch.uint8)), \
            f"expert {e}: live rows differ"
        assert bool(is_poison(out[e, m:]).all()), f"expert {e}: a row >= masked_m was written"
        assert not bool(is_poison(out[e, :m]).any()), f"expert {e}: a live row was not written"
