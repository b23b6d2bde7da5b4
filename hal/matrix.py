"""Which backend this machine (or a profile) picks for every model preset and weight format: the
table `hal probe` ends with, and the matrix the profile tests walk."""

from __future__ import annotations

import attrs

from hal import presets
from hal.backend import Target
from hal.caps import Caps
from hal.registry import decide, discover


@attrs.frozen
class MatrixRow:
    model: str
    weight_format: str
    op: str  # hal.ops name the preset's spec asks for
    device: str
    backend: str  # "-" when nothing fits
    reason: str
    slow: bool = False  # the reference oracle wins because nothing faster fits


def devices_of(caps: Caps) -> list:
    return ["cpu"] + [f"cuda:{gpu.index}" for gpu in caps.gpus[:1]]


def selection_matrix(caps: Caps, found=None) -> list:
    """Pure: runs every backend's check() and rank(), builds nothing."""
    found = discover() if found is None else found
    rows = []
    for preset in presets.PRESETS.values():
        for fmt in preset.formats:
            spec = preset.spec(fmt)
            for device in devices_of(caps):
                d = decide(spec, Target(device, caps), found)
                winner = next((c for c in d.candidates if c.name == d.winner), None)
                if d.slow:
                    reason = f"SLOW PATH, nothing faster fits: {d.losers()}"
                elif winner:
                    reason = winner.verdict.summary()
                else:
                    reason = "; ".join(f"{c.name}: {c.verdict.summary()}" for c in d.candidates)
                rows.append(MatrixRow(preset.name, fmt, d.op, device, d.winner or "-", reason, d.slow))
    return rows


def format_matrix(rows) -> str:
    head = ("model", "format", "op", "device", "backend", "why")
    table = [head] + [(r.model, r.weight_format, r.op, r.device,
                       f"{r.backend} (slow)" if r.slow else r.backend, r.reason) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    lines = []
    for row in table:
        cells = "  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True))
        lines.append(f"{cells}  {row[5]}")
    return "\n".join(lines)
