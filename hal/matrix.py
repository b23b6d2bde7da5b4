"""Which backend this machine (or a profile) picks for every model preset and weight format: the
table `hal probe` ends with, and the matrix the profile tests walk. `python -m hal.matrix
--markdown` prints docs/support-matrix.md: every format and activation on every recorded profile."""

from __future__ import annotations

import os
import sys

import attrs

from hal import presets
from hal.backend import Target
from hal.caps import Caps
from hal.ops import OPS
from hal.registry import decide, discover
from hal.spec import ACTIVATIONS, WEIGHT_FORMATS, MoESpec


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


# The support matrix (docs/support-matrix.md): one layer shape, every format and activation, every
# recorded profile. Regenerate with SUPPORT_MATRIX_COMMAND; tests/docs checks the page is current.
SUPPORT_MATRIX_COMMAND = "python -m hal.matrix --markdown > docs/support-matrix.md"
SUPPORT_MATRIX_LAYER = dict(num_experts=128, top_k=8, hidden_size=2048, intermediate_size=768)
SELECTION_VARIABLES = ("HAL_BACKENDS", "HAL_DISABLE_BACKENDS") + tuple(op.override_variable for op in OPS)
FALLBACK = "reference"


def support_spec(weight_format: str, activation: str) -> MoESpec:
    """The matrix's layer in one format and activation: w4afp8 in the masked layout (its only one);
    swiglu_oai with biases where the format allows them, as gpt-oss ships it."""
    masked = weight_format == "w4afp8"
    return MoESpec(**SUPPORT_MATRIX_LAYER, weight_format=weight_format, activation=activation,
                   has_bias=activation == "swiglu_oai" and not masked,
                   layout="masked" if masked else "tokens")


def support_cell(d) -> str:
    """The winner, then the other backends that would run it, best first; the reference, when it
    wins, in bold: no kernel backend takes the layer there."""
    if d.winner is None:
        return "-"
    others = sorted((c for c in d.candidates if c.eligible and c.name not in (d.winner, FALLBACK)),
                    key=lambda c: c.order_key())
    head = f"**{FALLBACK}**" if d.winner == FALLBACK else d.winner
    return head + "".join(f", then {c.name}" for c in others)


def support_matrix_markdown(found=None) -> str:
    """Pure given the registry: the page's text, whatever selection variables the caller set."""
    from hal.probe import list_profiles, load_profile

    found = discover() if found is None else found
    saved = {name: os.environ.pop(name) for name in SELECTION_VARIABLES if name in os.environ}
    try:
        targets = []
        for name in list_profiles():
            caps = load_profile(name)
            for device in devices_of(caps):
                where = "cpu" if device == "cpu" else f"{device} {caps.gpus[0].arch}"
                targets.append((name, where, Target(device, caps)))
        sections = []
        for fmt in WEIGHT_FORMATS:
            rows = [f"| {name} | {where} | " + " | ".join(
                support_cell(decide(support_spec(fmt, act), target, found)) for act in ACTIVATIONS) + " |"
                for name, where, target in targets]
            op = "moe_masked" if fmt == "w4afp8" else "moe"
            sections.append("\n".join([f"## {fmt} (op `{op}`)", "",
                                       "| profile | device | " + " | ".join(ACTIVATIONS) + " |",
                                       "| --- | --- | " + " | ".join("---" for _ in ACTIVATIONS) + " |",
                                       *rows]))
    finally:
        os.environ.update(saved)
    layer = ", ".join(f"{k}={v}" for k, v in SUPPORT_MATRIX_LAYER.items())
    intro = f"""# Support matrix

Which backend moe-hal selects for each weight format and activation on every recorded profile
([probe](probe.md#profiles-halprofilesjson)), from every backend's `check()` and `rank()`.
Generated, not written:

```bash
{SUPPORT_MATRIX_COMMAND}
```

`tests/docs/test_support_matrix.py` regenerates it and fails when this page differs.

The layer, in every cell:

```
MoESpec({layer})
```

with bf16 activations and no expert parallelism (a rank's share of the experts can choose
differently: marlin's int4 rule in particular). `swiglu_oai` carries biases where the format allows
them (as gpt-oss ships it); w4afp8 runs in the masked layout (DeepEP low-latency), every other
format in the token layout. Selection is per spec, so a layer of another shape can choose
differently: `hal select` shows the decision for any model.

A cell names the backend selected, then the others that would run the layer, best first.
**{FALLBACK}** in bold means no kernel backend runs the layer there: the portable torch oracle
does, correct and slow. Backends that run only when named (`prefer=` or the op's override
variable) are not listed."""
    return intro + "\n\n" + "\n\n".join(sections) + "\n"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hal.matrix", description=__doc__)
    parser.add_argument("--markdown", action="store_true", required=True,
                        help="print docs/support-matrix.md: the backend selected on every recorded "
                             "profile for every weight format and activation")
    parser.parse_args(argv)
    sys.stdout.write(support_matrix_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
