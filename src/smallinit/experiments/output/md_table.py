"""Markdown cells and tables for docs/results.md (results_doc.py, results_budgets.py)."""

from __future__ import annotations

import math

from smallinit.core.markdown import table  # noqa: F401 - docs/results.md's writers import it from here


def fmt(x, spec: str = ".4f") -> str:
    """A number as `spec`, or "–" for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)
