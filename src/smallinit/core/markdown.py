"""The one markdown-table writer: the report, docs/results.md, the wsd check and the benchmarks'
tables all come out of `table`, so a cell's escaping is the same everywhere."""

from __future__ import annotations


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table; a cell's "|" and newlines are escaped."""
    def esc(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(esc(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
