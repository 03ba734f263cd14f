"""Markdown cells and tables for docs/results.md (the repository's records/results_doc.py and
results_budgets.py) and fits.token_crossover."""

from __future__ import annotations

import math

from smallinit.core.markdown import table  # noqa: F401 - docs/results.md's writers import it from here


def fmt(x, spec: str = ".4f") -> str:
    """A number as `spec`, or "–" for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)
