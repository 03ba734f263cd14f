"""Markdown cells and tables for docs/results.md (results_doc.py, results_budgets.py)."""

from __future__ import annotations

import math


def fmt(x, spec: str = ".4f") -> str:
    """A number as `spec`, or "–" for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table; a cell's "|" and newlines are escaped."""
    def esc(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
