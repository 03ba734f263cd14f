"""The one reader of what a sweep folder holds besides its trials: the results table
(results.parquet), fixed_overrides.json (the command that repeats the sweep) and protocol.json
(the select-then-confirm choices). The sweeper writes them; the report, the comparison and the
record builders (records/) read them here. A table that is missing or cannot be read stops the
reader in one line naming it; a record that cannot be read is named once, by load(), and the
report then reads it as absent, while a reader that cannot go on without it (require_record) stops."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from smallinit.core import results_schema as schema
from smallinit.core.errors import first_line


class ReportError(Exception):
    """A problem the user can fix; its message is printed as one line."""

FIXED_OVERRIDES, PROTOCOL = "fixed_overrides.json", "protocol.json"
# name -> what the report leaves out where the record cannot be read
SWEEP_RECORDS = {FIXED_OVERRIDES: "the command that repeats the sweep",
                 PROTOCOL: "the select-then-confirm choices' command"}


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


def require_record(folder: Path, name: str) -> dict | None:
    """read_record for a reader that cannot go on without a readable record: None where the
    folder has none; ReportError naming a damaged one."""
    record, why = read_record(folder, name)
    if why is not None:
        raise ReportError(f"{Path(folder) / name} is unreadable ({why}): the sweep's command names the file and what to do")
    return record


@dataclass(frozen=True)
class Table:
    """A sweep's results table from one read of its file: the rows in today's names (an older
    table's through schema.upgrade), artifact paths as stored, and the sha256 of the bytes parsed.
    A record that quotes a table's hash and copies its rows takes both from here, so a sweep
    rewriting the file meanwhile cannot make them disagree."""

    folder: Path
    rows: pd.DataFrame
    sha256: str

    def local(self, short_names: bool = False) -> pd.DataFrame:
        """The rows with their artifact paths made local to the folder (a copied folder reads its
        own files); with `short_names`, the compared settings as the analysis names them
        (schema.analysis_names: config/init.gamma -> gamma)."""
        df = self.rows.copy()
        for column in schema.PATH_COLUMNS:
            if column in df:
                ids = df[schema.IDENTITY] if schema.IDENTITY in df else [None] * len(df)
                df[column] = [schema.to_local_path(v, self.folder, i) for v, i in zip(df[column], ids)]
        return schema.analysis_names(df) if short_names else df


def read_table_once(folder: Path) -> Table:
    """The sweep's results table (Table), or ReportError naming a missing or unreadable one."""
    folder = Path(folder)
    path = schema.results_path(folder)
    if not path.is_file():
        raise ReportError(f"{path} is missing: its sweep has not written its table yet (a sweep writes it when its "
                          "command ends or is stopped; rerun the command to rebuild it)")
    try:
        data = path.read_bytes()
        rows = schema.upgrade(pd.read_parquet(io.BytesIO(data)))
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise ReportError(f"{path} cannot be read: {first_line(e)}") from None
    return Table(folder, rows, hashlib.sha256(data).hexdigest())


def read_table(folder: Path, columns: list[str] | None = None, local_paths: bool = True,
               short_names: bool = False) -> pd.DataFrame:
    """The sweep's results table in today's names, its artifact paths local to this folder unless
    `local_paths` is False (a verbatim copy); `short_names` as Table.local. `columns` are today's names."""
    table = read_table_once(folder)
    df = table.local(short_names) if local_paths else (schema.analysis_names(table.rows) if short_names else table.rows)
    if columns is not None:
        missing = [c for c in columns if c not in df]
        if missing:
            renamed = schema.RENAMED.get(missing[0]) if not short_names else None
            raise ReportError(f"{schema.results_path(folder)} has no column {missing[0]!r}"
                              + (f": its name in the table is {renamed!r}" if renamed else ""))
        df = df[columns]
    return df


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
