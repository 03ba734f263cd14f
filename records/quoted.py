"""Numbers the docs quote from a committed record, held to that record.

A passage of a markdown page between `<!-- quotes: PATH -->` and `<!-- /quotes -->` (PATH from
the repository root: a .json record, or a .md/.log page a tool wrote) may state only numbers
that PATH holds: "2,659 tokens/s" matches a recorded 2659.19 (rounded to the places written),
"38.0%" a recorded fraction 0.380, and a number inside a string of the record ("bf16 matmul 192
GFLOP/s") counts too. Numbers inside `code` are commands and settings, not measurements, and are
not checked. tests/test_quoted_numbers.py runs this over every page of the repository.

    python -m records.quoted          # exit 1 and name each number no record holds
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .results_doc import QUOTES as BLOCK
from .results_doc import REPO, numbers_in


def _walk(value, out: list) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        out.append(float(value))
    elif isinstance(value, str):
        out.extend(float(n.replace(",", "")) for n in numbers_in(value))
    elif isinstance(value, dict):
        for v in value.values():
            _walk(v, out)
    elif isinstance(value, list):
        for v in value:
            _walk(v, out)


def record_values(path: Path) -> list[float]:
    """Every number a record holds: a JSON file's values (and the numbers in its strings), or
    the numbers written in a text file."""
    text = path.read_text()
    out: list[float] = []
    if path.suffix == ".json":
        _walk(json.loads(text), out)
    else:
        out.extend(float(n.replace(",", "")) for n in numbers_in(text))
    return out


def unheld(passage: str, values: list[float]) -> list[str]:
    """The numbers of a passage (outside `code`) that no recorded value rounds to."""
    prose = re.sub(r"`[^`]*`", " ", passage).replace("−", "-")
    percents = set(re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)%", prose))
    magnitudes = [abs(v) for v in values]

    def held(n: str) -> bool:
        plain = n.lstrip("+-").replace(",", "")
        k = len(plain.split(".")[1]) if "." in plain else 0
        x = float(plain)
        if any(round(v, k) == x for v in magnitudes):
            return True
        return n.lstrip("+-") in percents and any(round(100 * v, k) == x for v in magnitudes)

    return [n for n in sorted(numbers_in(prose)) if not held(n)]


def check(page: Path, repo: Path = REPO) -> list[str]:
    """One line per quoted number the named record does not hold (or per record that is missing)."""
    problems, page = [], Path(page).resolve()
    text = re.sub(r"`[^`\n]*<!--[^`\n]*`", " ", page.read_text())  # a marker shown as code is not one
    for source, passage in BLOCK.findall(text):
        record = repo / source
        if not record.is_file():
            problems.append(f"{page.relative_to(repo)}: quotes {source}, which does not exist")
            continue
        for n in unheld(passage, record_values(record)):
            problems.append(f"{page.relative_to(repo)}: {n} is not in {source}")
    return problems


def pages(repo: Path = REPO) -> list[Path]:
    """The repository's markdown pages: README.md and docs/**."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def main() -> int:
    problems = [p for page in pages() for p in check(page)]
    for p in problems:
        print(p, file=sys.stderr)
    print(f"{len(problems)} quoted number(s) no record holds" if problems else "every quoted number is in its record")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
