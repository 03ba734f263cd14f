"""A sweep folder's own records that the report reads besides its table: fixed_overrides.json
(the command that repeats the sweep) and protocol.json (the select-then-confirm choices). The
sweeper writes them; this is the one reader. A record that cannot be read is named once, by
load(), and every consumer then reads it as absent."""

from __future__ import annotations

import json
from pathlib import Path

from smallinit.core.errors import first_line

# name -> what the report leaves out where the record cannot be read
SWEEP_RECORDS = {"fixed_overrides.json": "the command that repeats the sweep",
                 "protocol.json": "the select-then-confirm choices' command"}


def read_record(folder: Path, name: str) -> tuple[dict | None, str | None]:
    """(the record, None); (None, None) where the folder has none; (None, why) where it is damaged."""
    path = Path(folder) / name
    if not path.exists():
        return None, None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, "empty" if path.is_file() and path.stat().st_size == 0 else first_line(e)
    return (record, None) if isinstance(record, dict) else (None, "not a JSON object")


def damaged_records(dirs: list[Path]) -> list[str]:
    """One line per record that exists but cannot be read: the sweep refuses to run on it, naming
    it; the report goes on without what it gave, and says so."""
    lines = []
    for d in dirs:
        for name, gives in SWEEP_RECORDS.items():
            _, why = read_record(d, name)
            if why is not None:
                lines.append(f"{Path(d) / name} is unreadable ({why}): this report leaves out {gives}; the sweep's "
                             "command names the file and what to do")
    return lines
