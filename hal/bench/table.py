"""Benchmark tables as aligned text for a terminal, or markdown for docs/."""

from __future__ import annotations


def table_lines(head, body, markdown: bool = False) -> list:
    if markdown:
        return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                + ["| " + " | ".join(row) + " |" for row in body])
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    return ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [head, *body]]
