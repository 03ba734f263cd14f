"""This repository's record builders: docs/results.md, the record of the CPU experiments
(results_doc, with results_budgets' block), the checks a record names: bf16 against fp32
(dtype_check), a WSD branch against a cosine run (wsd_check), the recipe's effective size at the
crossover record's width (crossover_size), train against held-out loss in the crossover record
(train_val), the lead per schedule from whole runs (whole_runs), the record's claims judged again
from its own numbers (record_claims), the docs' quoted numbers held to their records (quoted), and
a long record's finished trials carried between machines in git (keep).

They are the paper's one-off scripts over committed records, not the analysis library, so they sit
outside the installed package (src/smallinit): run them from the repository root as
`python -m records.<name>`. They import the library (`smallinit.experiments` and the floors it
stands on); nothing under src/ imports them (tests/test_architecture.py holds both to the line
below).

May import: core, model, experiments
"""

import contextlib
import sys
from pathlib import Path

# This checkout's src/ first, as sweep.py does: a record is built by the library beside it, even
# where the venv's editable install points at another checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

OVERWRITE_HELP = "replace a file no smallinit command wrote, or one edited since (smallinit.core.written)"


@contextlib.contextmanager
def refusals():
    """A refusal from the rule every output of ours follows (smallinit.core.written) as one line on
    stderr and exit status 2: nothing has been written when it is raised."""
    from smallinit.core.errors import ConfigError

    try:
        yield
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def write_record(path: Path, text: str, by: str, overwrite: bool = False) -> None:
    """Write one record file under that rule: never over a file no command of ours wrote, or one
    edited since, unless `overwrite`."""
    from smallinit.core import written

    with refusals():
        written.write_outputs(Path(path).parent, {Path(path).name: text}, by=by, adopt=overwrite)


def sweep_read(folder: Path):
    """A sweep's results table from one read of its file (sweep_records.Table: the rows, and the
    sha256 of the bytes they were parsed from), through the library's one reader of a sweep
    folder; a missing or damaged one ends the command in one line. A record that compares the
    rows, copies them and quotes the hash takes all three from one Table, so they agree even
    while a sweep rewrites the file."""
    from smallinit.experiments.data.sweep_records import ReportError, read_table_once

    try:
        return read_table_once(Path(folder))
    except ReportError as e:
        raise SystemExit(f"error: {e}") from None


def sweep_table(folder: Path, columns: list[str] | None = None, table=None):
    """A sweep's results table (`table`, else sweep_read's), its artifact paths local to the folder
    and its compared settings under their short names (gamma, lr, train_seed)."""
    from smallinit.experiments.data.load import hold_to_their_files

    df = (table or sweep_read(folder)).local(short_names=True)
    # Each COMPLETE row is held to its trial's folder, as the report holds it (a trial whose files
    # changed since the table was written is FAIL here, and named); a table copied without its
    # trials' folders keeps its rows as recorded.
    for line in hold_to_their_files(df):
        print(f"{folder}: {line}", file=sys.stderr)
    missing = [c for c in columns or [] if c not in df]
    if missing:
        raise SystemExit(f"error: {Path(folder) / 'results.parquet'} has no column {missing[0]!r}")
    return df[columns] if columns is not None else df


def sweep_protocol(folder: Path) -> dict:
    """A sweep's protocol.json through the same reader: {} where it has none; a damaged one ends the command."""
    from smallinit.experiments.data.sweep_records import PROTOCOL, ReportError, require_record

    try:
        return require_record(Path(folder), PROTOCOL) or {}
    except ReportError as e:
        raise SystemExit(f"error: {e}") from None


def committed_record(path: Path) -> dict:
    """A committed record's JSON (a summary.json, a claims.json, a --scaling-law fit): a missing,
    damaged or non-object one ends the command in one line naming it, not a traceback."""
    from smallinit.experiments.data.sweep_records import read_record

    path = Path(path)
    record, why = read_record(path.parent, path.name)
    if record is None and why is None:
        raise SystemExit(f"error: {path} does not exist: check the path (a committed record that went missing comes "
                         f"back with git checkout -- {path})")
    if record is None:
        raise SystemExit(f"error: {path} is unreadable ({why}): restore it (git checkout -- {path}) or rebuild it "
                         "with the command its README names")
    return record
