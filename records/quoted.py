"""Numbers the docs quote from a committed record, held to that record: a record's reading.md to
the section generated beside it (stray), and a marked passage of any page to the record it names.

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

REPO = Path(__file__).resolve().parents[1]


# Verdict words, longest first so that "not supported" is not also read as "supported".
VERDICT_WORDS = ("not enough data", "not supported", "not run", "supported", "contradicted", "inconclusive")
_NUMBER = re.compile(r"(?<![\w.^])([+-]?)(\d[\d,]*(?:\.\d+)?)")


def numbers_in(text: str) -> set[str]:
    """Every number as written, integers and decimals of any length: "+0.0634", "3", "327,680",
    "0.74" (of "0.74M"). A minus sign (− or -) or plus is kept; digits inside a word (fp32, L=4's
    "4" is kept: it follows "=") and exponents after ^ are not numbers a reader checks."""
    out = set()
    for sign, digits in _NUMBER.findall(text.replace("−", "-")):
        out.add(sign + digits.rstrip(","))
    return out


def decimals_in(text: str) -> set[str]:
    """Decimal numbers with 2+ places, as written (the changes note's check)."""
    return set(re.findall(r"[+-]?\d+\.\d{2,}", text))


def verdicts_in(text: str) -> set[str]:
    """The verdict words a text uses."""
    found, rest = set(), text.lower()
    for word in VERDICT_WORDS:
        hits = re.findall(rf"\b{word}\b", rest)
        if hits:
            found.add(word)
            rest = re.sub(rf"\b{word}\b", " ", rest)
    return found


# A number the generated section prints in e-notation (6.98e+05), which prose may write as a decimal.
_SCIENTIFIC = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?e[+-]?\d+")


def _same_number(written: str, shown: float) -> bool:
    """A decimal as prose writes it ("698,000", "0.0000182") is a value the section prints in
    e-notation (6.98e+05, 1.82e-05): the printed value is already rounded, so the two are equal;
    a sign the prose writes must be the shown one's."""
    value = float(written.replace(",", ""))
    return value == shown or (written[0] not in "+-" and value == -shown)


# A passage citing another record: `<!-- quotes: PATH -->...<!-- /quotes -->` (records/quoted.py checks it).
QUOTES = re.compile(r"<!-- quotes: (\S+) -->(.*?)<!-- /quotes -->", re.S)


def stray(reading: str, generated: str) -> list[str]:
    """The numbers and verdict words of a reading that its generated section does not show.
    A number written without a sign matches the section's number with either sign; "28%"
    matches a shown fraction that rounds to it (0.280); numbers inside `code` (a command, a
    config key) are not measurements and are not checked; nor are numbers in a `<!-- quotes: PATH -->`
    passage, which cite another record and are held to it (records/quoted.py)."""
    prose = re.sub(r"`[^`]*`", " ", QUOTES.sub(" ", reading))
    shown = numbers_in(generated)
    fractions = [float(x.replace(",", "")) for x in shown]
    percents = re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)%", prose.replace("−", "-"))
    scientific = [float(x) for x in _SCIENTIFIC.findall(generated.replace("−", "-"))]

    def ok(n: str) -> bool:
        if n in shown or (n[0] not in "+-" and {f"+{n}", f"-{n}"} & shown):
            return True
        if any(_same_number(n, x) for x in scientific):  # 698,000 in prose for a shown 6.98e+05
            return True
        if n.lstrip("+-") in percents:  # quoted as a percentage of a shown fraction
            k = len(n.split(".")[1]) if "." in n else 0
            return any(round(100 * abs(x), k) == abs(float(n.replace(",", ""))) for x in fractions)
        return False

    out = [n for n in sorted(numbers_in(prose)) if not ok(n)]
    return out + sorted(verdicts_in(prose) - verdicts_in(generated))



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
    for source, passage in QUOTES.findall(text):
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
