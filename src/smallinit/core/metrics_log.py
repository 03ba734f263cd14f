"""metrics.jsonl, a trial's log of its steps, read the one way every reader reads it.

The trainer (trainer/reporting.py) appends one whole line `{"step": N, ...}\\n` per write and
flushes it, so a kill or a full disk can leave one last line begun and not finished: that line
is left out, and the steps before it count. Any other line that is not a JSON object with an
integer step is damage no trainer leaves (an edit, another file's bytes): `DamagedLine` names the
line, and each reader turns it into its own one-line error naming the file. Readers: the trainer
resuming a trial, the results table (`TrialDir.last_metrics`), the study rebuilt from the
folders, the report's curves, and the records' train/val reading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_START = b'{"step": '  # how every line the trainer writes begins


class DamagedLine(ValueError):
    """A line of metrics.jsonl no trainer wrote; str() is "line N is ..." without the path."""


def metrics_rows(path: Path | str) -> list[dict[str, Any]]:
    """The logged steps in file order ([] without the file); a later line for a repeated step
    (a resumed trial) comes after the earlier one. OSError other than a missing file passes."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, as every whole file does
    rows = [_row(n, raw) for n, raw in enumerate(lines, 1) if raw.strip()]
    if tail.strip() and not cut_short(tail):
        rows.append(_row(len(lines) + 1, tail))
    return rows


def cut_short(tail: bytes) -> bool:
    """A last line (no newline after it) the trainer began and did not finish."""
    if tail[:len(_START)] != _START[:len(tail)]:
        return False
    try:
        json.loads(tail)
    except ValueError:
        return True
    return False


def _row(n: int, raw: bytes) -> dict[str, Any]:
    try:
        row = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        why = "is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else f"is not JSON ({e.msg})"
        raise DamagedLine(f"line {n} {why}") from None
    if not isinstance(row, dict) or not isinstance(row.get("step"), int) or isinstance(row["step"], bool):
        what = f"a {type(row).__name__}" if not isinstance(row, dict) else "an object without an integer step"
        raise DamagedLine(f"line {n} is {what}, not a logged step")
    return row
